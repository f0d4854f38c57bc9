"""GRPO learns: on a small budget, held-out greedy accuracy of the default recipe clearly rises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from trainer import loop
from trainer.config import Launch, deep_merge
from trainer.testing import write_test_launch

EXPERIMENT = Path(__file__).resolve().parents[2] / "config" / "experiments" / "tiny-addition.yaml"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_default_recipe_raises_held_out_addition_accuracy(tmp_path: Path) -> None:
    # The default experiment's batches and recipe on half its steps; accuracy is on the 20 validation pairs,
    # which training never samples.
    experiment = yaml.safe_load(EXPERIMENT.read_text())
    plan = experiment["role_plan"]
    batches = ("train_batch_size", "policy_mini_batch_size", "micro_train_batch_size_per_gpu")
    recipe = deep_merge(
        experiment["recipe"],
        {
            "trainer": {
                **{key: plan[key] for key in batches},
                "max_steps": 150,
                "ckpt_interval": 150,
                "eval_interval": 75,
                "eval_before_train": True,
            },
            "generator": {"n_samples_per_prompt": plan["n_samples_per_prompt"]},
        },
    )
    assert experiment["seed"] == 42
    launch = Launch.load(write_test_launch(tmp_path, seed=42, trainer=recipe))
    manifest = loop.run(launch)
    summary = manifest["metrics"]
    print(json.dumps(summary))
    assert summary["initial_eval_accuracy"] <= 0.1
    assert summary["final_eval_accuracy"] >= summary["initial_eval_accuracy"] + 0.15
    records = [json.loads(x) for x in Path(launch.metrics_uri).read_text().splitlines()]
    rewards = [r["reward_mean"] for r in records if "reward_mean" in r]
    assert sum(rewards[-10:]) >= 2 * sum(rewards[:10])
