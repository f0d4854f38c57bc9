"""Where the loop takes a step's samples from (trainer/sampling.py), on a stand-in sampler (no engines): which
weights may begin which step's generation, what a step takes, and how the generator thread ends."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from trainer.errors import TrainerError
from trainer.sampling import Asynchronous, Samples, Step, Synchronous, open_source


class Recorder:
    """A sampler that records, per step, the cursor it got and the policy version the engines held then."""

    def __init__(self, version: list[int], delay_s: float = 0.0, fail_at: int | None = None) -> None:
        self.version, self.delay_s, self.fail_at = version, delay_s, fail_at
        self.started: dict[int, tuple[int, int]] = {}

    def __call__(self, step: int, cursor: int) -> Step:
        self.started[step] = (cursor, self.version[0])
        if step == self.fail_at:
            raise RuntimeError("engine died")
        time.sleep(self.delay_s)
        samples = Samples([{"step": step}], [[1]], [], torch.zeros(1))
        return Step(samples, samples, cursor + 4, 1)


def train(source: Asynchronous | Synchronous, version: list[int], first: int, last: int) -> dict[int, dict]:
    """Take each step, "train" it, then sync its weights, as trainer/loop.py does; the metrics of each."""
    seen = {}
    for step in range(first, last + 1):
        taken = source.take(step)
        assert taken.step.update.rows == [{"step": step}]
        time.sleep(0.01)
        version[0] = step
        source.synced(step)
        seen[step] = taken.metrics
    source.close()
    return seen


def test_grpo_samples_each_step_with_the_last_steps_weights() -> None:
    version = [0]
    sampler = Recorder(version)
    seen = train(open_source("grpo", sampler, None, 0, 0, 1), version, 1, 5)
    assert sampler.started == {s: (4 * (s - 1), s - 1) for s in range(1, 6)}
    assert all(m == {} for m in seen.values())


@pytest.mark.parametrize("bound", [1, 2])
def test_fully_async_starts_a_step_only_within_the_staleness_bound(bound: int) -> None:
    version = [0]
    sampler = Recorder(version, delay_s=0.005)
    seen = train(open_source("fully_async", sampler, None, 0, 0, bound), version, 1, 8)
    assert [sampler.started[s][0] for s in range(1, 9)] == [4 * (s - 1) for s in range(1, 9)]  # the data order
    for step, (_, held) in sampler.started.items():
        assert step - 1 - held <= bound, (step, held)
    staleness = [seen[s]["async/staleness_max"] for s in range(1, 9)]
    assert max(staleness) == bound  # generation ran ahead as far as allowed (the sampler is faster than training)
    assert all(
        0 <= m["async/generation_busy_frac"] <= 1 and 0 <= m["async/training_busy_frac"] <= 1 for m in seen.values()
    )


def test_a_resumed_run_generates_from_its_checkpoint_on() -> None:
    version = [6]
    sampler = Recorder(version)
    train(open_source("fully_async", sampler, None, 6, 24, 1), version, 7, 9)
    assert min(sampler.started) == 7 and sampler.started[7] == (24, 6)


def test_a_generator_failure_is_raised_by_the_step_that_needed_it() -> None:
    version = [0]
    source = open_source("fully_async", Recorder(version, fail_at=3), None, 0, 0, 1)
    with pytest.raises(TrainerError, match="generator thread failed before step 3: engine died"):
        train(source, version, 1, 4)
    source.close()


def test_closing_stops_a_generator_waiting_on_the_bound() -> None:
    version = [0]
    source = open_source("fully_async", Recorder(version), None, 0, 0, 1)
    assert isinstance(source, Asynchronous)
    time.sleep(0.1)  # steps 1 and 2 generated; 3 waits for version 1
    source.close()
    assert not any(t.name == "rlbuild-generator" and t.is_alive() for t in threading.enumerate())
