"""`rlbuild status` on an agent train whose episodes starve, without a run: the verdict from the episodes the trainer
publishes (no episode finished past the experiment's bound while a batch plays, or half the ended episodes failed),
the errors named by kind, the bound read from `execution.episode_stall_after_s` (placement, not identity), and the
trainer's progress writer keeping its step's time while it publishes episodes, throttled but never dropping a
batch's beginning or end."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from rlbuild.contracts.progress import Progress, read_progress
from rlbuild.dev.launches import experiment_document
from rlbuild.ops.status import (
    EPISODE_STALL_AFTER_S,
    MIN_ENDED_FOR_RATE,
    Options,
    errors_text,
    starvation,
    train_ladder,
)
from rlbuild.plan.preflight import parse_experiment
from rlbuild.plan.resolve import resolve

NOW = 1_800_000_000.0


def episodes(**keys: Any) -> dict[str, Any]:
    return {"playing": True, "since": NOW - 60, "finished": 0, "errors": {}, "last_finished": None, **keys}


@pytest.mark.parametrize(
    ("published", "verdict"),
    [
        # Sandboxes that do not start: nothing finished for 13 minutes, 37 starts failed.
        (
            episodes(since=NOW - 780, errors={"start_error": 37}),
            "stalled: no episodes finished in 13m (sandbox errors 37: start error)",
        ),
        # Commands that hang with no limit: nothing ended at all.
        (episodes(since=NOW - 800), "stalled: no episodes finished in 13m"),
        # The last finished episode counts, not when the batches began.
        (episodes(since=NOW - 3000, finished=5, last_finished=NOW - 60), None),
        (episodes(since=NOW - 3000, finished=5, last_finished=NOW - 730), "stalled: no episodes finished in 12m"),
        # Between batches (the policy's update) nothing is expected to finish: the step's own stall judges that.
        (episodes(playing=False, since=NOW - 3000, finished=30, last_finished=NOW - 3000), None),
        # Episodes end, but most on their sandbox: stalled by the error rate, playing or not.
        (
            episodes(finished=2, errors={"command_timeout": 20, "sandbox_ended": 10}),
            "stalled: 30 of 32 episodes failed (sandbox errors 30: command timeout 20, sandbox ended 10)",
        ),
        (
            episodes(playing=False, finished=16, errors={"command_timeout": 16}),
            "stalled: 16 of 32 episodes failed (sandbox errors 16: command timeout)",
        ),
        (episodes(finished=17, errors={"command_timeout": 15}), None),  # under half
        (episodes(errors={"setup_error": MIN_ENDED_FOR_RATE - 1}), None),  # too few to judge a rate
    ],
)
def test_starving_episodes_are_stalled_naming_the_errors(published: dict[str, Any], verdict: str | None) -> None:
    assert starvation(published, NOW, EPISODE_STALL_AFTER_S) == verdict


def test_the_default_bound_is_twelve_minutes_and_a_short_one_is_seconds() -> None:
    assert EPISODE_STALL_AFTER_S == 720
    assert starvation(episodes(since=NOW - 7), NOW, 5.0) == "stalled: no episodes finished in 7s"
    assert starvation(episodes(since=NOW - 4), NOW, 5.0) is None
    assert errors_text({}) == ""


def test_the_bound_is_placement_and_reaches_the_verdict(tmp_path: Path) -> None:
    """A train whose trainer (this process) publishes a batch that has finished nothing for 10 s: stalled under a
    5 s bound with no ETA, healthy under the default; the bound changes no identity."""
    model = tmp_path / "model"  # a local: model folder stands in for the base model: nothing here trains
    model.mkdir()
    (model / "config.json").write_text("{}")
    short = experiment_document(tmp_path / "sources", execution={"episode_stall_after_s": 5}, model_dir=model)
    default = experiment_document(tmp_path / "sources", model_dir=model)
    plans = [resolve(parse_experiment(doc, "test"), "dev", str(tmp_path / "storage")) for doc in (short, default)]
    identities = [{kind: record["identity"] for kind, record in plan.records.items()} for plan in plans]
    assert identities[0] == identities[1]  # (each record's created_at is the second it was resolved in)
    assert plans[0].experiment.execution.episode_stall_after_s == 5
    launch = plans[0].launch
    progress = Progress(launch.artifacts.attempts_root, 100)
    progress.step(3, force=True)
    progress.episodes(episodes(since=time.time() - 10, errors={"start_error": 4}), force=True)
    ladders = [train_ladder(launch, {"state": "running"}, Options(), time.time(), bound) for bound in (5.0, 720.0)]
    stalled, healthy = ladders
    assert stalled["state"] == "running", stalled
    assert stalled["verdict"].startswith("stalled: no episodes finished in 1"), stalled["verdict"]
    assert stalled["verdict"].endswith("(sandbox errors 4: start error)") and stalled["ladder"]["eta_s"] is None
    assert healthy["verdict"] == "healthy", healthy["verdict"]


def test_published_episodes_keep_the_step_time_and_never_drop_a_batch_edge(tmp_path: Path) -> None:
    progress = Progress(str(tmp_path), 100, min_interval_s=3600)
    progress.step(7, force=True)
    stepped = read_progress(str(tmp_path))
    assert stepped is not None and "episodes" not in stepped
    progress.episodes(episodes(finished=1), force=False)  # within the interval: not written
    assert read_progress(str(tmp_path)) == stepped
    progress.step(8)  # throttled too, but the next write carries it
    progress.episodes(episodes(playing=False, finished=2), force=True)  # a batch ended: written now
    found = read_progress(str(tmp_path))
    assert found is not None and found["episodes"]["finished"] == 2 and found["episodes"]["playing"] is False
    assert found["step"] == 8 and found["time"] > stepped["time"]
    time.sleep(0.01)
    progress.episodes(episodes(finished=3), force=True)
    again = read_progress(str(tmp_path))
    assert again is not None and again["time"] == found["time"]  # an episodes' write is not a step
