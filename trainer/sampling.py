"""A step's samples: prompts drawn from the train rows, completions from the engines, rewards from the environment.

With `trainer.algorithm.dynamic_sampling.type: filter` (DAPO's dynamic sampling, bounded as SkyRL bounds it), a
step draws up to `max_sample_batches` batches of `train_batch_size` prompts until that many groups carry signal
(rewards that differ); the update takes those groups first, then tops up with groups without signal, whose KL
term still anchors the policy. Under a sparse reward (one group in 30 holding a right answer at first) the rare
right answers then make up most of the update instead of a few rows of it, which is what makes GRPO take off
early and on every seed rather than by luck (trainer/README.md, "Robust recipes"). Generating is cheap next to
training here: the update's size, and so a step's training cost, does not change.

Everything derives from (seed, step, batch) and the data cursor, so a resumed run draws exactly the same samples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedTokenizerBase

from rlbuild.contracts.recipe import Recipe
from trainer import data
from trainer.agents.episodes import Episode, EpisodePlayer
from trainer.env import Environment
from trainer.rewards import rewards as score_rollouts
from trainer.workers import grpo
from trainer.workers.engines import Rollout, SamplingParams
from trainer.workers.roles import Roles

# Seeds of a step's extra sample batches sit this far apart, past every (seed, step) seed of the first batch.
BATCH_SEED_STRIDE = 1 << 40


@dataclass(frozen=True)
class Samples:
    """Whole GRPO groups, in order: their rows, prompt ids, completions and rewards; and, where the environment is
    an agent's, the episodes they came from (turns, how each ended: trainer/agents/episodes.py)."""

    rows: list[dict[str, Any]]
    prompts: list[list[int]]
    rollouts: list[Rollout]
    rewards: torch.Tensor
    episodes: list[Episode] | None = None

    def groups(self, size: int) -> list[Samples]:
        return [self._take(slice(i, i + size)) for i in range(0, len(self.rows), size)]

    def _take(self, rows: slice) -> Samples:
        episodes = self.episodes[rows] if self.episodes is not None else None
        return Samples(self.rows[rows], self.prompts[rows], self.rollouts[rows], self.rewards[rows], episodes)

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        played = all(p.episodes is not None for p in parts)
        return Samples(
            [r for p in parts for r in p.rows],
            [x for p in parts for x in p.prompts],
            [x for p in parts for x in p.rollouts],
            torch.cat([p.rewards for p in parts]),
            [e for p in parts for e in p.episodes or []] if played else None,
        )

    @staticmethod
    def of_episodes(episodes: list[Episode]) -> Samples:
        return Samples(
            [e.row for e in episodes],
            [e.prompt_ids for e in episodes],
            [e.rollout for e in episodes],
            torch.tensor([e.reward for e in episodes]),
            episodes,
        )


@dataclass(frozen=True)
class Step:
    """What a step trains on (`update`), everything it sampled (`drawn`: the unbiased view for metrics), the data
    cursor after it, and how many sample batches it took."""

    update: Samples
    drawn: Samples
    cursor: int
    batches: int


def rollout_seed(seed: int, step: int, batch: int) -> int:
    """The engines' seed for sample batch `batch` of `step` (batch 0: the seed a step always had)."""
    return seed * data.SEED_STRIDE + step + batch * BATCH_SEED_STRIDE


def sample_step(
    roles: Roles,
    tokenizer: PreTrainedTokenizerBase,
    environment: Environment | EpisodePlayer,
    train_rows: list[dict[str, Any]],
    recipe: Recipe,
    step: int,
    cursor: int,
) -> Step:
    """Draw, generate and score one step's groups (several sample batches under dynamic sampling); where the
    environment is an agent's, each sample is an episode its player plays."""
    t, g = recipe.trainer, recipe.generator
    sampling = SamplingParams.from_recipe(g.sampling_params)
    dynamic = t.algorithm.dynamic_sampling
    limit = dynamic.max_sample_batches if dynamic.type == "filter" else 1
    batches: list[Samples] = []
    signal = 0
    while len(batches) < limit and (not batches or signal < t.train_batch_size):
        rows = data.group(data.draw(train_rows, cursor, t.train_batch_size, t.seed), g.n_samples_per_prompt)
        cursor += t.train_batch_size
        seed = rollout_seed(t.seed, step, len(batches))
        if isinstance(environment, EpisodePlayer):
            batches.append(Samples.of_episodes(environment.play(roles.generate, rows, sampling, seed)))
        else:
            prompts = data.encode_prompts(tokenizer, rows)
            rollouts = roles.generate(prompts, sampling, seed)
            rewards = torch.tensor(score_rollouts(tokenizer, environment, rows, rollouts))
            batches.append(Samples(rows, prompts, rollouts, rewards))
        signal += int((~grpo.uniform_groups(batches[-1].rewards, g.n_samples_per_prompt)).sum())
    drawn = Samples.concat(batches)
    if dynamic.type is None:
        return Step(drawn, drawn, cursor, 1)
    groups = drawn.groups(g.n_samples_per_prompt)
    uniform = grpo.uniform_groups(drawn.rewards, g.n_samples_per_prompt).tolist()
    ranked = [grp for grp, flat in zip(groups, uniform, strict=True) if not flat]
    ranked += [grp for grp, flat in zip(groups, uniform, strict=True) if flat]
    return Step(Samples.concat(ranked[: t.train_batch_size]), drawn, cursor, len(batches))
