"""GRPO learns: held-out greedy accuracy clearly rises, for both built-in tasks' shipped experiments."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlbuild.contracts.launch import load_launch
from rlbuild.dev.launches import write_test_launch
from trainer import loop

EXPERIMENTS = Path(__file__).resolve().parents[2] / "config" / "experiments"
EXPERIMENT = EXPERIMENTS / "tiny-addition.yaml"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_default_recipe_raises_held_out_addition_accuracy(tmp_path: Path) -> None:
    # The default experiment's batches and recipe on half its steps; accuracy is on the 20 validation pairs,
    # which training never samples.
    experiment = yaml.safe_load(EXPERIMENT.read_text())
    recipe = experiment["recipe"]
    recipe["trainer"].update({"max_steps": 150, "ckpt_interval": 150, "eval_interval": 75, "eval_before_train": True})
    assert experiment["seed"] == 42
    launch = load_launch(str(write_test_launch(tmp_path, seed=42, role_plan=experiment["role_plan"], recipe=recipe)))
    manifest = loop.run(launch)
    summary = manifest["metrics"]
    print(json.dumps(summary))
    assert summary["initial_eval_accuracy"] <= 0.1
    assert summary["final_eval_accuracy"] >= summary["initial_eval_accuracy"] + 0.15
    records = [json.loads(x) for x in Path(launch.artifacts.metrics_uri).read_text().splitlines()]
    rewards = [r["reward/mean"] for r in records if "reward/mean" in r]
    assert sum(rewards[-10:]) >= 2 * sum(rewards[:10])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_reversal_experiment_learns_the_held_out_strings(tmp_path: Path) -> None:
    # The shipped recipe as it is (800 steps, zero_variance_filter), its seed and split; eval at the end only.
    experiment = yaml.safe_load((EXPERIMENTS / "tiny-reversal.yaml").read_text())
    recipe = experiment["recipe"]
    recipe["trainer"].update(
        {"ckpt_interval": recipe["trainer"]["max_steps"], "eval_interval": -1, "eval_before_train": True}
    )
    revision = experiment["data"]["train"][0]["revision"]
    path = write_test_launch(
        tmp_path,
        task="reversal",
        seed=experiment["seed"],
        data_seed=int(revision.removeprefix("seed-")),
        role_plan=experiment["role_plan"],
        recipe=recipe,
    )
    summary = loop.run(load_launch(str(path)))["metrics"]
    print(json.dumps(summary))
    assert summary["initial_eval_accuracy"] <= 0.1
    assert summary["final_eval_accuracy"] >= 0.5
