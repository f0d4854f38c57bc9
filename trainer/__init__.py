"""rlbuild's GRPO trainer: `python -m trainer run --launch launch.yaml` (see trainer/README.md)."""
