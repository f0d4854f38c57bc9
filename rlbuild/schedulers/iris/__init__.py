"""Iris: its scheduler (`scheduler.py`), client (`client.py`), plan side (`plan.py`), detached coordinator
(`coordinator.py`) and a local cluster for tests (`localcluster.py`)."""
