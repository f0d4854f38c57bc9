"""A step's samples: prompts drawn from the train rows, completions from the engines, rewards from the environment.

With `trainer.algorithm.dynamic_sampling.type: filter` (DAPO's dynamic sampling, bounded as SkyRL bounds it), a
step draws up to `max_sample_batches` batches of `train_batch_size` prompts until that many groups carry signal
(rewards that differ); the update takes those groups first, then tops up with groups without signal, whose KL
term still anchors the policy. Under a sparse reward (one group in 30 holding a right answer at first) the rare
right answers then make up most of the update instead of a few rows of it, which is what makes GRPO take off
early and on every seed rather than by luck (trainer/README.md, "Robust recipes"). Generating is cheap next to
training here: the update's size, and so a step's training cost, does not change.

Everything derives from (seed, step, batch) and the data cursor, so a resumed synchronous run draws exactly the
same samples.

Where the loop takes a step's samples from (`runtime.entrypoint`, the launch's `recipe.trainer.entrypoint`):

    grpo         the step samples its groups itself, with the weights the last step synced: on-policy.
    fully_async  a generator thread samples the next steps while the policy trains, into a buffer the step takes
                 from. A sample records the policy version (steps synced) whose weights began it; generation for
                 step k starts only once the engines hold version k - 1 - max_staleness_steps or newer, so no
                 sample trains more than max_staleness_steps versions after its own and none is ever dropped for
                 age. TIS corrects what staleness there is (preflight requires it). New weights reach the engines
                 between two of their generate calls: generation pauses for the transfer only.

Both draw the same prompts for a step (the data cursor passes from step to step, seeds derive from (seed, step));
only which weights sample them differs, and under fully_async that depends on timing, so a resumed asynchronous
run trains the same prompts but not the same bits. The buffer is never checkpointed: a resumed run regenerates
the steps after its checkpoint, so nothing is trained twice or skipped.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from rlbuild.contracts.recipe import Recipe
from trainer import data
from trainer.agents.episodes import Episode, EpisodePlayer
from trainer.env import Environment
from trainer.errors import TrainerError
from trainer.rewards import rewards as score_rollouts
from trainer.workers import grpo
from trainer.workers.engines import Rollout, SamplingParams
from trainer.workers.roles import Roles

# Seeds of a step's extra sample batches sit this far apart, past every (seed, step) seed of the first batch.
BATCH_SEED_STRIDE = 1 << 40
# How long closing the generator thread waits for a generate call under way (the actors' shutdown ends it otherwise).
CLOSE_WAIT_S = 30.0


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


Sample = Callable[[int, int], Step]  # (step, data cursor) -> the step's groups


@dataclass(frozen=True)
class Taken:
    """One step's samples and what producing them cost: seconds, the environment's seconds and sandboxes (agent
    runs), and the asynchronous loop's metrics (none for grpo)."""

    step: Step
    generate_s: float
    environment_s: float = 0.0
    sandboxes_started: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


class StepSource(Protocol):
    def take(self, step: int) -> Taken: ...

    def synced(self, version: int) -> None:
        """The engines now hold the weights of `version` (steps trained)."""

    def close(self) -> None: ...


def open_source(
    entrypoint: str, sample: Sample, player: EpisodePlayer | None, step: int, cursor: int, max_staleness: int
) -> StepSource:
    """The source of the steps after `step` (the resume point, or 0), whose data starts at `cursor`."""
    if entrypoint == "fully_async":
        return Asynchronous(sample, player, step, cursor, max_staleness)
    return Synchronous(sample, player, cursor)


def _spent(player: EpisodePlayer | None) -> tuple[float, int]:
    return player.spent() if player is not None else (0.0, 0)


class Synchronous:
    """grpo: each step samples with the weights of the step before."""

    def __init__(self, sample: Sample, player: EpisodePlayer | None, cursor: int) -> None:
        self._sample, self._player, self._cursor = sample, player, cursor

    def take(self, step: int) -> Taken:
        _spent(self._player)  # the last eval's episodes are not this step's
        started = time.monotonic()
        sampled = self._sample(step, self._cursor)
        self._cursor = sampled.cursor
        return Taken(sampled, time.monotonic() - started, *_spent(self._player))

    def synced(self, version: int) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Ready:
    step: Step
    version: int  # steps trained into the weights the engines held when this step's generation began
    generate_s: float
    environment_s: float
    sandboxes_started: int


class Asynchronous:
    """fully_async: a generator thread runs `sample` for the steps ahead, bounded by the staleness rule."""

    def __init__(
        self, sample: Sample, player: EpisodePlayer | None, step: int, cursor: int, max_staleness: int
    ) -> None:
        self._sample, self._player, self._bound = sample, player, max_staleness
        self._version = step  # a resumed run's engines are synced to its checkpoint before the first take
        self._ready: dict[int, _Ready] = {}
        self._error: BaseException | None = None
        self._closed = False
        self._changed = threading.Condition()
        self._busy_s, self._busy_since, self._last_read = 0.0, None, time.monotonic()
        _spent(player)  # an eval's episodes before the first step are not a step's
        self._thread = threading.Thread(
            target=self._generate, args=(step + 1, cursor), name="rlbuild-generator", daemon=True
        )
        self._thread.start()

    def _startable(self, step: int) -> bool:
        return self._closed or self._version >= step - 1 - self._bound

    def _generate(self, step: int, cursor: int) -> None:
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(partial(self._startable, step))
                    if self._closed:
                        return
                    version, began = self._version, time.monotonic()
                    self._busy_since = began
                sampled = self._sample(step, cursor)
                environment_s, started = _spent(self._player)
                with self._changed:
                    ended = time.monotonic()
                    self._busy_s += ended - self._busy_since  # since `began`, or since the last take's reading
                    self._busy_since = None
                    self._ready[step] = _Ready(sampled, version, ended - began, environment_s, started)
                    self._changed.notify_all()
                step, cursor = step + 1, sampled.cursor
        except BaseException as error:  # handed to the training thread, which raises it
            with self._changed:
                if not self._closed:
                    self._error = error
                self._busy_since = None
                self._changed.notify_all()

    def take(self, step: int) -> Taken:
        waited = time.monotonic()
        with self._changed:
            self._changed.wait_for(lambda: step in self._ready or self._error is not None)
            if step not in self._ready:
                raise TrainerError(f"the generator thread failed before step {step}: {self._error}") from self._error
            ready = self._ready.pop(step)
            waited = time.monotonic() - waited
            staleness = step - 1 - ready.version
            if staleness > self._bound:  # the start rule makes this impossible: a broken invariant, not a drop
                raise TrainerError(f"step {step} took samples {staleness} versions old (bound {self._bound})")
            now = time.monotonic()
            busy = self._busy_s + (now - self._busy_since if self._busy_since is not None else 0.0)
            if self._busy_since is not None:
                self._busy_since = now
            self._busy_s, interval, self._last_read = 0.0, max(now - self._last_read, 1e-9), now
            metrics = {
                "async/staleness_mean": float(staleness),
                "async/staleness_max": float(staleness),
                "async/policy_version": float(ready.version),
                "async/buffer_depth": float(len(self._ready)),
                "async/wait_s": waited,
                "async/generation_busy_frac": min(busy / interval, 1.0),
                "async/training_busy_frac": max(0.0, 1.0 - waited / interval),
            }
        return Taken(ready.step, ready.generate_s, ready.environment_s, ready.sandboxes_started, metrics)

    def synced(self, version: int) -> None:
        with self._changed:
            self._version = version
            self._changed.notify_all()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._thread.join(CLOSE_WAIT_S)
