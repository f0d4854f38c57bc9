"""GRPO learns the task, not the table: for both built-in tasks' shipped experiments (their own seed, 42), held-out
greedy accuracy (on prompts training never samples) rises from the base model's ~0 to well past chance.

The thresholds are what the experiment's seed cleared with margin under every perturbation that stands in for
another CPU (`benchmarks/learning_spread.py`; trainer/README.md, "Robust recipes"), and on the other machine of
this kind that issue 18 reports: addition 1.00 everywhere, reversal 0.96 / 0.76 / 0.64 here and 0.32 there. Other
seeds spread wider, and no assertion here rides on one bit pattern. A failing run prints the curve it saw (reward,
held-out and train-prompt accuracy at each eval).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlbuild.contracts.launch import load_launch
from rlbuild.dev.launches import write_test_launch
from trainer import loop

EXPERIMENTS = Path(__file__).resolve().parents[2] / "config" / "experiments"


def _train(tmp_path: Path, task: str, steps: int | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The shipped `tiny-<task>` experiment (its seed, split, role plan and recipe; `steps` cuts it short), evaluated
    ten times on the way; returns the terminal manifest's metrics and every metrics line."""
    experiment = yaml.safe_load((EXPERIMENTS / f"tiny-{task}.yaml").read_text())
    recipe = experiment["recipe"]
    steps = steps or recipe["trainer"]["max_steps"]
    recipe["trainer"].update(
        {"max_steps": steps, "ckpt_interval": steps, "eval_interval": steps // 10, "eval_before_train": True}
    )
    revision = experiment["data"]["train"][0]["revision"]
    path = write_test_launch(
        tmp_path,
        task=task,
        seed=experiment["seed"],
        data_seed=int(revision.removeprefix("seed-")),
        role_plan=experiment["role_plan"],
        recipe=recipe,
    )
    launch = load_launch(str(path))
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


# (task, steps, held-out accuracy at the end). Reversal runs its whole recipe: 5 of the 25 unseen strings, where the
# base model gets 0-1 and a guess 1 in 125, and every machine got 0.32 or more. Addition runs 150 of its 500 steps
# (CI's time), as the test of rounds 1-2 did on two boxes; its own seed is at 0.60-0.70 by step 150 of the full
# schedule under every perturbation.
THRESHOLDS = [("addition", 150, 0.15), ("reversal", None, 0.2)]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("task", "steps", "held_out"), THRESHOLDS, ids=[t[0] for t in THRESHOLDS])
def test_the_shipped_experiment_learns_its_held_out_prompts(
    tmp_path: Path, task: str, steps: int | None, held_out: float
) -> None:
    summary, records = _train(tmp_path, task, steps)
    curve = _curve(records)
    print(curve)
    rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
    assert summary["initial_eval_accuracy"] <= 0.1, curve
    assert summary["final_eval_accuracy"] >= held_out, curve
    assert sum(rewards[-10:]) >= 2 * sum(rewards[:10]) and sum(rewards[-10:]) > 0, curve
