"""Rewards: each completion decoded and scored by the recipe's environment against its row."""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from trainer.env import Environment
from trainer.workers.engines import Rollout


def rewards(
    tokenizer: PreTrainedTokenizerBase, environment: Environment, rows: list[dict[str, Any]], rollouts: list[Rollout]
) -> list[float]:
    texts = tokenizer.batch_decode([r.token_ids for r in rollouts], skip_special_tokens=True)
    return [environment.reward(row, text, r.finished) for row, text, r in zip(rows, texts, rollouts, strict=True)]
