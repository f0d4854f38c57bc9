"""The benchmarks run: each on the smallest budget that still exercises every line of it (the numbers are
measured by hand, with `make bench`; here they only have to come out)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO


def _bench(*argv: str, timeout: float = 600) -> str:
    result = subprocess.run(
        [sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


@pytest.mark.slow
def test_dry_run_benchmark_prints_its_ratios() -> None:
    """Every row on its smallest budget (2 versions for 50, one run each): local, S3, S3 through the proxy."""
    out = _bench("benchmarks/dry_run.py", "--smoke")
    assert "local: floor: snakemake -n, empty Snakefile" in out and "local: rlbuild dry run, 2 versions" in out
    for label in ("s3", "s3+20ms"):
        assert f"{label}: rlbuild dry run, 2 versions built" in out and f"{label}: rlbuild status, 2 versions" in out
        assert f"{label}: rlbuild dry run, 2 versions empty, -q (no job list)" in out
    assert "s3+20ms built: storage requests per extra version" in out


@pytest.mark.slow
def test_trainer_vs_trl_compares_the_same_objective_and_times_both_sides() -> None:
    """Both rows (seq_mean_token_mean vs TRL grpo, token_mean vs TRL dapo) agree on a fixed batch (the benchmark
    asserts it), then one row trains a few steps on each side and prints its s/step, accuracy and ratio."""
    checked = _bench("benchmarks/trainer_vs_trl.py", "--check-only", "--rows", "dapo")
    timed = _bench("benchmarks/trainer_vs_trl.py", "--steps", "3", "--rows", "grpo")  # it checks grpo first
    assert "[dapo] agreement on a fixed batch" in checked and "[grpo] agreement on a fixed batch" in timed
    assert "speed-up" in timed and "s/step" in timed


@pytest.mark.slow
def test_learning_spread_trains_a_perturbed_cell_and_prints_its_row() -> None:
    out = _bench(
        "benchmarks/learning_spread.py",
        "--task",
        "addition",
        "--seeds",
        "42",  # the shipped seed: its base model is already in the session's cache
        "--perturb",
        "weights-1e-6",
        "--steps",
        "2",
        "--jobs",
        "1",
    )
    assert "addition  seed  42 weights-1e-6  held-out" in out and "worst addition:" in out


def test_learning_spread_names_a_perturbation_that_changed_no_bit() -> None:
    """A perturbation that trains exactly as 'none' (AVX2 kernels on a CPU without AVX-512) is no evidence, and the
    benchmark says so instead of counting it as a machine that agreed."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from learning_spread import _inert_perturbations

    def cell(seed: int, perturbation: str, norms: list[float]) -> dict[str, object]:
        return {
            "task": "addition",
            "seed": seed,
            "perturbation": perturbation,
            "records": [{"step": i, "policy/grad_norm": g} for i, g in enumerate(norms)],
        }

    results = [
        cell(1, "none", [0.1, 0.5]),
        cell(1, "isa-avx2", [0.1, 0.5]),
        cell(1, "threads-2", [0.1, 0.5]),
        cell(7, "none", [0.2, 0.6]),
        cell(7, "isa-avx2", [0.2, 0.6]),
        cell(7, "threads-2", [0.2, 0.61]),
    ]
    assert _inert_perturbations(results) == ["isa-avx2"]


@pytest.mark.slow
def test_fsdp_cpu_benchmark_prints_its_ratios() -> None:
    out = _bench("benchmarks/fsdp_cpu.py", "--steps", "5")  # the first 3 steps are warm-up
    assert "FSDP2" in out


def test_agent_rollout_measures_the_three_sandbox_designs() -> None:
    """A few episodes each way (the benchmark first checks all sides give the same outputs)."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from agent_rollout import measure_sandbox

    row = measure_sandbox(episodes=3)
    assert set(row) == {
        "open_s",
        "command_s",
        "close_s",
        "episode_s",
        "pool_open_s",
        "pool_command_s",
        "pool_close_s",
        "pool_episode_s",
        "fresh_command_s",
        "fresh_episode_s",
        "command_ratio",
        "episode_ratio",
        "pool_ratio",
        "pool_fresh_ratio",
    }
    assert all(value > 0 for value in row.values())


@pytest.mark.slow
def test_async_vs_sync_trains_every_entrypoint_the_schema_accepts_as_its_loop() -> None:
    """A value the plan accepts and the trainer ignores can never come back: every `runtime.entrypoint` is one of the
    benchmark's loops, and each trains three steps of the same work as the loop it names (the benchmark checks
    both: the launch documents differ only in the loop; staleness only under fully_async, within its bound)."""
    from typing import get_args

    from rlbuild.contracts.launch import Runtime

    sys.path.insert(0, str(REPO / "benchmarks"))
    from async_vs_sync import LOOPS

    assert set(LOOPS) == set(get_args(Runtime.model_fields["entrypoint"].annotation))
    out = _bench("benchmarks/async_vs_sync.py", "--tasks", "addition", "--steps", "3")
    assert "same work (checked)" in out and "speed-up" in out
    assert all(f"  {loop} " in out for loop in LOOPS), out
