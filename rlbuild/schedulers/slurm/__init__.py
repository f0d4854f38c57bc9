"""Slurm: its scheduler (`scheduler.py`), plan side (`plan.py`) and the train chain across wall-clock limits
(`chain.py`)."""
