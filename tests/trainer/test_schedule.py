"""The learning-rate schedule: linear warmup, then constant or cosine down to min_lr_ratio at the last step."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rlbuild.contracts.recipe import Recipe
from trainer.workers.policy import LearningRateSchedule


def test_constant_with_warmup() -> None:
    schedule = LearningRateSchedule("constant_with_warmup", warmup=4, total=100, min_ratio=0.1)
    assert [schedule(n) for n in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert schedule(99) == 1.0


def test_cosine_with_warmup_by_hand() -> None:
    schedule = LearningRateSchedule("cosine_with_warmup", warmup=2, total=12, min_ratio=0.1)
    assert [schedule(n) for n in (0, 1)] == [0.5, 1.0]
    assert schedule(2) == pytest.approx(1.0)
    assert schedule(7) == pytest.approx(0.55)  # half way: min + (1 - min) / 2
    assert schedule(12) == pytest.approx(0.1)
    assert schedule(50) == pytest.approx(0.1)  # past the end it stays at the floor
    assert all(schedule(n) >= schedule(n + 1) for n in range(2, 12))


def test_unknown_schedule_and_bad_floor_are_named() -> None:
    recipe = {"trainer": {"policy": {"optimizer_config": {"scheduler": "linear", "min_lr_ratio": 2}}}}
    with pytest.raises(ValidationError) as error:
        Recipe.model_validate(recipe)
    problems = {".".join(map(str, e["loc"])): e["msg"] for e in error.value.errors()}
    assert problems == {
        "trainer.policy.optimizer_config.scheduler": "Input should be 'constant_with_warmup' or 'cosine_with_warmup'",
        "trainer.policy.optimizer_config.min_lr_ratio": "Input should be less than or equal to 1",
    }
