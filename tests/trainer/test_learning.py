"""GRPO learns: on a small budget, held-out greedy accuracy of the default recipe clearly rises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer import loop
from trainer.config import Launch
from trainer.testing import write_test_launch


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_default_recipe_raises_addition_accuracy(tmp_path: Path) -> None:
    # The default experiment's batches (16 prompts x 16 samples, micro 16) and the base recipe, fewer steps.
    recipe = {
        "trainer": {
            "train_batch_size": 16,
            "policy_mini_batch_size": 16,
            "micro_train_batch_size_per_gpu": 16,
            "max_steps": 150,
            "ckpt_interval": 150,
            "eval_interval": 50,
            "eval_before_train": True,
        },
        "generator": {"n_samples_per_prompt": 16},
    }
    launch = Launch.load(write_test_launch(tmp_path, seed=42, trainer=recipe))
    manifest = loop.run(launch)
    summary = manifest["metrics"]
    print(json.dumps(summary))
    assert summary["initial_eval_accuracy"] <= 0.1
    assert summary["final_eval_accuracy"] >= summary["initial_eval_accuracy"] + 0.15
    records = [json.loads(x) for x in Path(launch.metrics_uri).read_text().splitlines()]
    rewards = [r["reward_mean"] for r in records if "reward_mean" in r]
    assert sum(rewards[-10:]) >= 2 * sum(rewards[:10])
