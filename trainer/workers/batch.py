"""A step's rollouts as the tensors the policy ranks train on: padded sequences, advantages, loss weights, shards.

Loss weights normalise over each whole optimizer mini-batch (trainer/workers/grpo.py), and rank r gets the r-th
contiguous slice of every mini-batch, so the gradient is the same whatever the micro-batch size or world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trainer.workers import grpo
from trainer.workers.engines import Rollout

if TYPE_CHECKING:  # the recipe's schema needs pydantic, which a bare GPU node lacks (scripts/gpu_check.py)
    from rlbuild.contracts.recipe import Recipe

Batch = dict[str, torch.Tensor]


def build_batch(prompts: list[list[int]], rollouts: list[Rollout], pad_id: int) -> Batch:
    """[left-padded prompt | right-padded completion] tensors for the policy workers. An agent episode's observation
    tokens are attended to but carry completion mask 0: no policy loss, KL, entropy or TIS term counts them."""
    prompt_width = max(map(len, prompts))
    completion_width = max(len(r.token_ids) for r in rollouts)
    n = len(prompts)
    ids = torch.full((n, prompt_width + completion_width), pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    mask = torch.zeros((n, completion_width))
    rollout_logp = torch.zeros((n, completion_width))
    for i, (prompt, rollout) in enumerate(zip(prompts, rollouts, strict=True)):
        length = len(rollout.token_ids)
        ids[i, prompt_width - len(prompt) : prompt_width] = torch.tensor(prompt)
        ids[i, prompt_width : prompt_width + length] = torch.tensor(rollout.token_ids)
        attention[i, prompt_width - len(prompt) : prompt_width + length] = 1
        mask[i, :length] = torch.tensor(rollout.sampled_mask(), dtype=mask.dtype)
        rollout_logp[i, :length] = torch.tensor(rollout.logprobs)
    return {"input_ids": ids, "attention_mask": attention, "completion_mask": mask, "rollout_logprobs": rollout_logp}


def add_loss_weights(batch: Batch, mini_rows: int, reduction: str) -> None:
    """Per-token weights normalised over each whole optimizer mini-batch (HEAD semantics, no micro bias).

    `loss_weights` reduce the policy loss as the recipe says; `seq_weights` (sequence mean of token means) the KL
    term, as SkyRL keeps it; `token_weights` (token mean) the entropy bonus, as TRL and SkyRL take it.
    """
    mask = batch["completion_mask"]
    weights = {name: torch.zeros_like(mask) for name in ("loss_weights", "seq_weights", "token_weights")}
    for start in range(0, mask.shape[0], mini_rows):
        rows = slice(start, start + mini_rows)
        weights["loss_weights"][rows] = grpo.reduction_weights(mask[rows], reduction)
        weights["seq_weights"][rows] = grpo.reduction_weights(mask[rows], "seq_mean_token_mean")
        weights["token_weights"][rows] = grpo.reduction_weights(mask[rows], "token_mean")
    batch.update(weights)


def drop_zero_variance_groups(
    batch: Batch, rewards: torch.Tensor, group_size: int, mini_rows: int, world: int
) -> tuple[Batch, int]:
    """Keep only groups whose rewards differ (the others have advantage 0: no policy gradient).

    Each mini-batch keeps its own informative rows, padded (completion mask 0, so zero weight) to a common
    size that splits evenly over the ranks. Returns the new batch and its rows per mini-batch.
    Under the seq_mean_* reductions the loss averages over the kept sequences, so each weighs n_all / n_kept
    more than without the filter: the step grows by that factor (token_mean likewise, by the token ratio).
    """
    informative = (~grpo.uniform_groups(rewards, group_size)).repeat_interleave(group_size)
    n = informative.shape[0]
    kept = [torch.nonzero(informative[s : s + mini_rows]).flatten() + s for s in range(0, n, mini_rows)]
    width = max(world, -(-max(len(k) for k in kept) // world) * world)
    index, padding = [], []
    for start, rows in zip(range(0, n, mini_rows), kept, strict=True):
        fill = width - len(rows)
        index.append(torch.cat([rows, torch.full((fill,), start, dtype=torch.long)]))
        padding.append(torch.cat([torch.zeros(len(rows), dtype=torch.bool), torch.ones(fill, dtype=torch.bool)]))
    out = {k: v[torch.cat(index)] for k, v in batch.items()}
    out["completion_mask"] = out["completion_mask"].masked_fill(torch.cat(padding)[:, None], 0.0)
    return out, width


def shard(batch: Batch, mini_rows: int, world: int) -> list[Batch]:
    """Rank r gets the r-th contiguous slice of every mini-batch, so each optimizer step spans all ranks."""
    per_rank = mini_rows // world
    n = batch["input_ids"].shape[0]
    shards = []
    for rank in range(world):
        index = torch.cat(
            [torch.arange(s + rank * per_rank, s + (rank + 1) * per_rank) for s in range(0, n, mini_rows)]
        )
        shards.append({k: v[index] for k, v in batch.items()})
    return shards


@dataclass(frozen=True)
class UpdateBatch:
    """What one global step trains on: the whole batch, and how many of its rows make one optimizer mini-batch."""

    tensors: Batch
    rows_per_mini: int

    def shards(self, world: int) -> list[Batch]:
        return shard(self.tensors, self.rows_per_mini, world)


def update_batch(
    prompts: list[list[int]],
    rollouts: list[Rollout],
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    recipe: Recipe,
    pad_id: int,
) -> UpdateBatch:
    """Tensors, advantages and loss weights of a step; groups without signal dropped if the recipe says so."""
    t, g = recipe.trainer, recipe.generator
    batch = build_batch(prompts, rollouts, pad_id)
    batch["advantages"] = advantages
    rows_per_mini = t.policy_mini_batch_size * g.n_samples_per_prompt
    if t.algorithm.zero_variance_filter:
        world = t.placement.policy_world_size
        batch, rows_per_mini = drop_zero_variance_groups(batch, rewards, g.n_samples_per_prompt, rows_per_mini, world)
    add_loss_weights(batch, rows_per_mini, t.algorithm.loss_reduction)
    return UpdateBatch(batch, rows_per_mini)
