"""GRPO learns the task, not the table: for each built-in task's shipped experiment (addition, reversal and the
agent's find the key; their own seed, 42), held-out greedy accuracy (on prompts training never samples; for the
agent, episodes solved) rises well above the base model's and reaches most prompts.

The thresholds are what every cell of trainer/README.md's "Robust recipes" cleared with margin: three seeds, each
as this machine runs it and under perturbations that stand in for another CPU (`benchmarks/learning_spread.py`:
torch's AVX2 and portable kernels, two threads, base weights perturbed by 1e-6). trainer/tiny.py builds the base
model with pinned numerics, the same bits on one box, but an Intel and an AMD box build different ones (addition
starts at 0.55 and 0.40 held-out): the gain asked shrinks with what the base model leaves. No assertion rides on one
bit pattern.
A failing run prints the curve it saw (reward, held-out and train-prompt accuracy at each eval).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlbuild.contracts.launch import load_launch
from rlbuild.dev.launches import write_shipped_launch
from trainer import loop

EXPERIMENTS = Path(__file__).resolve().parents[2] / "config" / "experiments"


def _train(tmp_path: Path, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The shipped experiment `tiny-<name>` (its seed, base model variant, task, split, role plan and recipe),
    evaluated five times on the way; returns the terminal manifest's metrics and every metrics line."""
    steps = yaml.safe_load((EXPERIMENTS / f"tiny-{name}.yaml").read_text())["recipe"]["trainer"]["max_steps"]
    schedule = {"ckpt_interval": steps, "eval_interval": max(steps // 5, 1), "eval_before_train": True}
    launch = load_launch(str(write_shipped_launch(tmp_path, f"tiny-{name}", recipe={"trainer": schedule})))
    summary = loop.run(launch)["metrics"]
    records = [json.loads(line) for line in Path(launch.artifacts.metrics_uri).read_text().splitlines()]
    return summary, records


def _curve(records: list[dict[str, Any]]) -> str:
    """The learning curve, one eval per line: what a failing assertion shows."""
    rewards = {r["step"]: r["reward/mean"] for r in records if "reward/mean" in r}
    lines = ["step  reward  held-out  train-prompts"]
    for record in (r for r in records if "eval/accuracy" in r):
        step = record["step"]
        reward = f"{rewards[step]:.3f}" if step in rewards else "  -  "
        lines.append(f"{step:>4}  {reward:>6}  {record['eval/accuracy']:>8.2f}  {record['eval/train_accuracy']:>13.2f}")
    return "\n".join(lines)


# (task, held-out accuracy at the end, its least gain over the base model's). Each runs its whole shipped recipe.
# Every cell measured: addition 0.85-0.95 held-out at the end, a gain of 0.45-0.80; reversal 0.96-1.00, 0.68-0.96;
# agent 1.00 in each of 9 cells (seeds 42, 1, 7 x none, threads-2, weights-1e-6), from 0.00-0.25.
THRESHOLDS = [("addition", 0.6, 0.3), ("reversal", 0.7, 0.3), ("agent", 0.8, 0.3)]
HEADROOM_SHARE = 0.5
# Accuracies are fractions of 20-25 held-out prompts: compared with a tolerance far below one prompt, so a value
# exactly at a threshold (0.85 - 0.55) is not refused by float rounding.
TOLERANCE = 1e-9


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("task", "held_out", "gain"), THRESHOLDS, ids=[t[0] for t in THRESHOLDS])
def test_the_shipped_experiment_learns_its_held_out_prompts(
    tmp_path: Path, task: str, held_out: float, gain: float
) -> None:
    summary, records = _train(tmp_path, task)
    curve = _curve(records)
    print(curve)
    rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
    initial, final = summary["initial_eval_accuracy"], summary["final_eval_accuracy"]
    assert final >= held_out - TOLERANCE, curve
    # A base model that already answers more held-out prompts leaves less to gain: the gain asked is `gain`, or
    # HEADROOM_SHARE of what the base leaves, whichever is smaller (on this session's Intel Xeon the pinned base
    # starts addition at 0.55 where the AMD EPYC's started at 0.40; 0.55 -> 0.85 is 0.30, not < 0.3).
    assert final - initial >= min(gain, HEADROOM_SHARE * (1 - initial)) - TOLERANCE, curve
    # The reward is dense from the first step (the base model samples right answers), so it rises rather than
    # takes off: every measured cell averaged 0.88 or more over its last 20 steps; the default run 0.91 over its
    # last 10, 0.28 above its first 10. A short run (the agent's 15 steps) compares its first and last thirds.
    window = min(10, len(rewards) // 3)
    first, last = sum(rewards[:window]) / window, sum(rewards[-window:]) / window
    assert last >= max(0.8, first + 0.1), curve
    if task == "agent":
        _assert_the_step_benchmark_reads_the_agent_steps(records)


def _assert_the_step_benchmark_reads_the_agent_steps(records: list[dict[str, Any]]) -> None:
    """benchmarks/agent_rollout.py's step row, from this run's own metrics (one run, not a second training): every
    step's episodes took 1-3 turns, and the environment's seconds lie inside the rollout's, inside the step's."""
    sys.path.insert(0, str(EXPERIMENTS.parents[1] / "benchmarks"))
    from agent_rollout import step_row

    role_plan = yaml.safe_load((EXPERIMENTS / "tiny-agent.yaml").read_text())["role_plan"]
    steps = [r for r in records if "perf/step_time_s" in r]
    row = step_row(steps, role_plan["train_batch_size"] * role_plan["n_samples_per_prompt"])
    assert all(1.0 <= r["episode/turns_mean"] <= 3.0 for r in steps), steps
    assert 0 < row["environment_s"] < row["rollout_s"] <= row["step_s"], row
    assert 0 < row["environment_share"] < 1 and row["episodes_per_s"] > 0, row
