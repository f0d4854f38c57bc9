"""Leases in storage: exactly one run builds an artifact; a dead run's lease is taken over; against moto S3 (whose
conditional writes are real: checked first) and a local folder."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlbuild.core import storage
from rlbuild.ops.lease import LeaseHeldError, Leases, held_leases, lease_uri, read_lease


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "experiment")
    return f"{request.getfixturevalue('s3_root')}/experiment"


def test_conditional_writes_are_conditional(root: str) -> None:
    uri = storage.join(root, "once")
    assert storage.create_exclusive(uri, "first")
    assert not storage.create_exclusive(uri, "second")
    text, tag = storage.read_tagged(uri)  # type: ignore[misc]
    assert text == "first"
    newer = storage.replace_if(uri, "third", tag)
    assert newer is not None and storage.read_text(uri) == "third"
    assert storage.replace_if(uri, "stale writer", tag) is None  # its tag is no longer current
    assert storage.read_text(uri) == "third"


def test_one_run_holds_an_artifact_and_the_other_is_told_who(root: str) -> None:
    uri = lease_uri(root, "train", "2026.09.21")
    first, second = Leases(), Leases()
    first.acquire(uri, "train/v2026.09.21/terminal.json of tiny")
    with pytest.raises(LeaseHeldError) as refused:
        second.acquire(uri, "train/v2026.09.21/terminal.json of tiny")
    message = str(refused.value)
    assert f"run {first.holder.run} of {first.holder.user}@{first.holder.host}" in message
    assert re.search(r"last heartbeat \d s ago", message) and "taken over" in message
    assert list(held_leases(root)) == ["train/v2026.09.21"]
    first.release_all()
    assert read_lease(uri) is None
    second.acquire(uri, "train")  # free again
    second.release_all()


def test_a_dead_runs_lease_is_taken_over_and_the_old_holder_learns_it(root: str) -> None:
    uri = lease_uri(root, "stage_data", "dev")
    dead = Leases(heartbeat_s=60, stale_s=0.2)
    dead.acquire(uri, "stage/data/vdev")
    time.sleep(0.3)  # no heartbeat since: stale
    alive = Leases(heartbeat_s=0.05, stale_s=0.2)
    alive.acquire(uri, "stage/data/vdev")
    assert read_lease(uri)["run"] == alive.holder.run  # type: ignore[index]
    dead.heartbeat_s = 0.05
    dead.start_heartbeat()
    deadline = time.monotonic() + 10
    while not dead.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dead.lost == [uri]
    dead.release_all()  # must not delete the new holder's lease
    assert read_lease(uri)["run"] == alive.holder.run  # type: ignore[index]
    alive.start_heartbeat()
    first_beat = read_lease(uri)["heartbeat_epoch"]  # type: ignore[index]
    time.sleep(0.3)
    assert read_lease(uri)["heartbeat_epoch"] > first_beat  # type: ignore[index]
    alive.release_all()
    assert read_lease(uri) is None


def _hold_in_another_process(uri: str) -> subprocess.Popen[str]:
    """A real process on this machine that takes the lease and then sleeps, as a run does while it builds."""
    code = (
        "import sys, time\nfrom rlbuild.ops.lease import Leases\n"
        f"Leases().acquire({uri!r}, 'train')\nprint('held', flush=True)\ntime.sleep(600)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=os.environ)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def test_a_lease_of_a_killed_process_on_this_machine_is_taken_over_at_once(root: str) -> None:
    """A run killed with SIGKILL cannot release its leases; the rerun typed right after must not wait out STALE_S."""
    uri = lease_uri(root, "train", "2026.09.21")
    holder = _hold_in_another_process(uri)
    try:
        with pytest.raises(LeaseHeldError):  # alive: refused even though it is on this machine
            Leases().acquire(uri, "train")
    finally:
        holder.kill()
        holder.wait()
    rerun = Leases()  # default stale_s: only the dead pid lets it in
    rerun.acquire(uri, "train")
    assert read_lease(uri)["run"] == rerun.holder.run  # type: ignore[index]
    rerun.release_all()


def test_a_killed_runs_leases_of_completed_artifacts_are_cleared_by_the_next_run(root: str) -> None:
    """A killed run leaves the leases of what it had finished; the next run clears those (their artifacts are
    complete, their holder dead) and leaves alone a live holder's and an incomplete artifact's."""
    finished, unfinished, live = (lease_uri(root, kind, "2026.09.21") for kind in ("stage_model", "train", "eval"))
    dead = [_hold_in_another_process(finished), _hold_in_another_process(unfinished)]
    alive = _hold_in_another_process(live)
    try:
        for holder in dead:
            holder.kill()
            holder.wait()
        cleared = Leases().clear_abandoned(root, lambda kind, version: kind in ("stage_model", "eval"))
        assert cleared == ["stage_model/v2026.09.21"]
        assert set(held_leases(root)) == {"train/v2026.09.21", "eval/v2026.09.21"}
    finally:
        alive.kill()
        alive.wait()
