"""scripts/gpu_check.py, the first thing to run on a new GPU node: `--tiny` runs all of it on CPU (so it cannot rot),
its recipe is a valid one, and what it compares names every mismatch."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from types import ModuleType

import pytest
import torch

from rlbuild.contracts.recipe import Recipe, recipe_problems
from tests.conftest import REPO


def _gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gpu_check = _gpu_check()


# The project's dependencies a bare GPU node image lacks (it has CUDA torch and transformers): the script runs here as
# if they were not installed (`None` in sys.modules: an import fails, importlib.util.find_spec says absent).
ABSENT = ("pydantic", "ray", "vllm", "snakemake", "s3fs", "boto3", "wandb", "psutil", "pyarrow", "matplotlib")
AS_ON_A_BARE_NODE = f"""import runpy, sys
sys.modules.update(dict.fromkeys({ABSENT!r}))
sys.argv = ["scripts/gpu_check.py", "--tiny"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_tiny_runs_the_trainer_path_and_prints_its_figures() -> None:
    """As a person runs it, from the checkout's root, with none of the project's other dependencies importable."""
    result = subprocess.run(
        [sys.executable, "-c", AS_ON_A_BARE_NODE], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert out.rstrip().endswith("[gpu-check] passed") and "MISMATCH" not in result.stderr
    for line in (
        "generation (torch engine, KV cache, 16 samples, the first, warm-up included):",
        "generation (torch engine, KV cache, 16 samples, after the sync):",
        "training (one GRPO step: reference and old scoring, 2 AdamW steps of micro-batches of 4; prompt and",
        "weight sync (gloo broadcast of the full weights):",
        "peak host memory (RSS)",
    ):
        assert line in out
    assert out.count("tokens/s") == 3  # two generations and the step
    # The step moved the policy; after the sync the engine's logprobs are the policy's to the bit.
    assert "the step moved the policy's probe logprobs by up to" in out
    assert "(the trainer's weight-sync check): max |difference| 0 (tolerance 0.0001)" in out


@pytest.mark.parametrize("size", ["FULL", "SMALL"])
def test_its_recipe_is_a_valid_recipe_and_reads_as_one(size: str) -> None:
    """A bare node cannot import the recipe's schema: the check's recipe is validated here instead, and the two
    properties it states by hand are what the schema computes."""
    chosen = getattr(gpu_check, size)
    validated = Recipe.model_validate(gpu_check.recipe(chosen))
    assert recipe_problems(validated) == []
    read = gpu_check.recipe_object(chosen)
    assert read.reference_workers == validated.reference_workers == 0
    assert read.trainer.placement.policy_world_size == validated.trainer.placement.policy_world_size == 1
    assert read.trainer.algorithm.use_tis and read.generator.weight_sync_check_tolerance == 1.0e-4


def test_weights_that_differ_or_did_not_arrive_are_named() -> None:
    policy = {"embed.weight": torch.ones(3, 2), "norm.weight": torch.ones(2)}
    assert gpu_check.weight_differences(policy, {k: v.clone() for k, v in policy.items()}) == []
    nudged = {"embed.weight": torch.ones(3, 2), "norm.weight": torch.ones(2) + 1e-7, "lm_head.weight": torch.ones(3, 2)}
    assert gpu_check.weight_differences(policy, nudged) == [
        "weight sync: 1 tensor names on one side only: ['lm_head.weight']",
        "weight sync: 1 tensors differ from the policy's: ['norm.weight']",
    ]


def test_a_difference_past_the_tolerance_or_nan_is_a_mismatch_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    problems = gpu_check.Problems()
    problems.within("close", 1e-6, 1e-4)
    problems.within("far", 2e-3, 1e-4)
    problems.within("broken", float("nan"), 1e-4)
    assert problems == ["far: max |difference| 0.002 > 0.0001", "broken: max |difference| nan > 0.0001"]
    monkeypatch.setattr(gpu_check, "check", lambda *_: problems)
    assert gpu_check.main(["--tiny"]) == 1
    captured = capsys.readouterr()
    assert "[gpu-check] MISMATCH far: max |difference| 0.002 > 0.0001" in captured.err
    assert captured.out.rstrip().endswith("[gpu-check] FAILED: 2 mismatch(es)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_a_gpu_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpu_check.main([]) == 2
    assert "sees no CUDA device" in capsys.readouterr().err
