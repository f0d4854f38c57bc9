"""Test-only helpers around the launch builder (rlbuild/dev/launches.py)."""

from __future__ import annotations

import pytest
import torch


def placeable(gpu_bundles: int) -> pytest.MarkDecorator:
    """Skip a test whose roles take `gpu_bundles` GPUs on a machine with fewer. Without GPUs a bundle is a CPU and
    the test runs; with enough GPUs it runs on them (FSDP2 over NCCL, the engines on CUDA)."""
    gpus = torch.cuda.device_count()
    reason = f"the test places {gpu_bundles} GPU bundles and this machine has {gpus} GPU(s)"
    return pytest.mark.skipif(0 < gpus < gpu_bundles, reason=reason)
