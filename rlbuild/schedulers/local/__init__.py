"""A local run: Snakemake's own executor (`scheduler.py`)."""
