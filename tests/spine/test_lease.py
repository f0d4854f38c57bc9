"""Leases in storage: exactly one run builds an artifact; a dead run's lease is taken over, judged by storage's
clock; a person breaks a lease; a run that lost its lease writes nothing more (two real processes, one frozen);
against moto S3 (whose conditional writes are real: checked first) and a local folder."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlbuild.cli import main
from rlbuild.core import storage
from rlbuild.dev.s3 import S3Server
from rlbuild.ops.lease import Holder, LeaseHeldError, Leases, held_leases, lease_uri, leases_and_breaks, read_lease
from rlbuild.workflow import fence_uploads


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


def test_a_dead_runs_lease_is_taken_over_and_the_old_holder_learns_it(root: str, capsys: pytest.CaptureFixture) -> None:
    uri = lease_uri(root, "stage_data", "dev")
    dead = Leases(heartbeat_s=60, stale_s=0.2)
    dead.acquire(uri, "stage/data/vdev")
    time.sleep(1.1)  # no heartbeat since: stale (S3 tells an object's age to the second)
    alive = Leases(heartbeat_s=0.05, stale_s=0.2)
    alive.acquire(uri, "stage/data/vdev")
    assert read_lease(uri)["run"] == alive.holder.run  # type: ignore[index]
    dead.heartbeat_s = 0.05
    dead.start_heartbeat()
    deadline = time.monotonic() + 10
    while not dead.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dead.lost == [uri]
    assert f"lost the lease {uri} to run {alive.holder.run} of " in capsys.readouterr().err
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


def test_a_leases_age_is_read_from_storages_clock_not_its_holders(root: str, capsys: pytest.CaptureFixture) -> None:
    """A lease written by a host whose clock runs an hour ahead cannot be kept past its heartbeats, one whose clock
    runs an hour behind cannot be stolen while fresh, and an unreadable one is named for what it is."""
    ahead, behind, unreadable = (lease_uri(root, kind, "2026.09.21") for kind in ("train", "export", "eval"))
    for uri, skew in ((ahead, 3600), (behind, -3600)):
        written = json.loads(Holder(host="node-7").document()) | {"heartbeat_epoch": time.time() + skew}
        storage.write_json(uri, written)
    storage.write_text(unreadable, "{not a lease")
    for uri in (ahead, behind, unreadable):
        with pytest.raises(LeaseHeldError) as refused:  # just written: live, whatever time its host recorded
            Leases().acquire(uri, "train")
        assert re.search(r"last (heartbeat|written) [0-9] s ago", str(refused.value)), str(refused.value)
    assert "an unreadable lease" in str(refused.value) and "None" not in str(refused.value)
    time.sleep(1.1)  # no write since, by storage's clock (S3 tells it to the second)
    for uri in (ahead, behind, unreadable):
        taker = Leases(stale_s=0.5)
        taker.acquire(uri, "train")
        assert read_lease(uri)["run"] == taker.holder.run  # type: ignore[index]
    assert "from an unreadable lease" in capsys.readouterr().err


def test_lease_break_refuses_a_live_holder_unless_forced_and_is_recorded_where_status_shows_it(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    storage_root = str(tmp_path / "results")
    experiment_root = storage.join(storage_root, "tiny-addition")
    uri = lease_uri(experiment_root, "train", "2026.09.21")
    where = ["--experiment", "tiny-addition", "--storage-root", storage_root]
    assert main(["lease", "break", "train/v2026.09.21", *where]) == 1
    assert "no run holds the lease of train/v2026.09.21" in capsys.readouterr().err
    holder = Leases(heartbeat_s=0.05)
    holder.acquire(uri, "train")
    assert main(["lease", "break", "train/v2026.09.21", *where]) == 1
    refused = capsys.readouterr().err
    assert f"held by a live run: run {holder.holder.run}" in refused and "--force" in refused
    assert read_lease(uri)["run"] == holder.holder.run  # type: ignore[index]
    assert main(["lease", "break", "train/v2026.09.21", "--force", *where]) == 0
    assert f"forced): run {holder.holder.run}" in capsys.readouterr().out
    assert read_lease(uri) is None
    holder.start_heartbeat()  # the holder, still alive, learns it at its next heartbeat and never takes it back
    deadline = time.monotonic() + 10
    while not holder.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert holder.lost == [uri] and read_lease(uri) is None
    assert f"run {holder.holder.run} lost the lease {uri} (it was broken" in capsys.readouterr().err
    holder.release_all()
    (record,) = leases_and_breaks(experiment_root)[1]["train/v2026.09.21"]
    assert record["forced"] and record["lease"]["run"] == holder.holder.run and "@" in record["by"]
    assert main(["status", "train/v2026.09.21", *where]) == 0
    shown = capsys.readouterr().out
    assert re.search(rf"lease broken by \S+@\S+ at \S+; it was held by run {holder.holder.run} ", shown), shown


# A job building train under its lease, as the Snakemake run (`arm_jobs` at onstart) and the rule's subcommand
# (`job_lease`) set it up; each line on stdin is one write it makes (a checkpoint file, terminal.json, the record).
HOLDER_JOB = """
import os, sys
from rlbuild.core import storage
from rlbuild.dev.s3 import S3Server
from rlbuild.core.errors import RlbuildError
from rlbuild.ops.lease import Leases, arm_jobs, job_lease, lease_uri
root, version = sys.argv[1], sys.argv[2]
leases = Leases(heartbeat_s=0.2, stale_s=1.0)
leases.acquire(lease_uri(root, "train", version), "train")
leases.start_heartbeat()
arm_jobs(root, leases.holder.run, os.environ)
job_lease("train", f"train/v{version}.identity.json", os.environ)
print(leases.holder.run, flush=True)
try:
    for line in sys.stdin:
        key, text = line.split()
        storage.write_text(storage.join(root, key), text)
        print("wrote", key, flush=True)
except RlbuildError as error:
    print(f"rlbuild: {error}", file=sys.stderr, flush=True)
    sys.exit(1)
"""


def test_a_frozen_holder_continued_after_a_takeover_writes_nothing_and_exits_naming_the_new_holder(
    s3_root: str, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run A builds train on S3 and is frozen (SIGSTOP of its process group) past its lease's expiry; run B takes
    the lease over and writes the artifact; A, continued, writes nothing more (its job's writes and its Snakemake's
    uploads are fenced) and exits non-zero naming B's run. B's artifact stands."""
    root, version = f"{s3_root}/tiny-addition", "2026.09.21"
    uri = lease_uri(root, "train", version)
    a = subprocess.Popen(
        [sys.executable, "-c", HOLDER_JOB, root, version],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert a.stdin is not None and a.stdout is not None
    run_a = a.stdout.readline().strip()
    a.stdin.write("tmp/checkpoints/global_step_5/state A\n")
    a.stdin.flush()
    assert a.stdout.readline().split() == ["wrote", "tmp/checkpoints/global_step_5/state"]
    os.killpg(a.pid, signal.SIGSTOP)
    try:
        b = Leases(stale_s=1.0)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # A's last heartbeat ages by storage's clock, to the second
            try:
                b.acquire(uri, "train")
                break
            except LeaseHeldError:
                time.sleep(0.2)
        assert read_lease(uri)["run"] == b.holder.run  # type: ignore[index]
        monkeypatch.setenv(storage.LEASE_ENV, uri)
        monkeypatch.setenv(storage.LEASE_RUN_ENV, b.holder.run)
        for key in ("train/v2026.09.21/terminal.json", "train/v2026.09.21.identity.json"):
            storage.write_text(storage.join(root, key), "B")
    finally:
        os.killpg(a.pid, signal.SIGCONT)
    out, err = a.communicate("train/v2026.09.21/terminal.json A\ntrain/v2026.09.21.identity.json A\n", timeout=60)
    assert a.returncode == 1 and "wrote" not in out, out + err
    assert f"run {run_a} lost its lease {uri}: run {b.holder.run} of " in err, err
    assert "Traceback" not in err
    for key in ("train/v2026.09.21/terminal.json", "train/v2026.09.21.identity.json"):
        assert storage.read_text(storage.join(root, key)) == "B"
    _snakemake_uploads_are_fenced(root, s3_server, tmp_path, monkeypatch, run_a, b)
    b.release_all()


def _snakemake_uploads_are_fenced(
    root: str, s3_server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_a: str, b: Leases
) -> None:
    """Under S3 default storage a job's outputs are uploaded by Snakemake's S3 plugin: A's Snakemake would upload
    terminal.json after its job; the fenced plugin refuses, and uploads B's."""
    from snakemake_storage_plugin_s3 import StorageObject, StorageProvider, StorageProviderSettings

    monkeypatch.setattr(StorageObject, "store_object", StorageObject.store_object)  # restored after the test
    monkeypatch.setattr(storage, "_LOST", {})
    fence_uploads(root)
    settings = StorageProviderSettings(endpoint_url=s3_server.endpoint, access_key="k", secret_key="s")
    provider = StorageProvider(local_prefix=tmp_path / "plugin", logger=logging.getLogger(), settings=settings)
    terminal = provider.object(storage.join(root, "train/v2026.09.21/terminal.json"))
    terminal.local_path().parent.mkdir(parents=True, exist_ok=True)
    terminal.local_path().write_text("A")
    monkeypatch.setenv(storage.LEASE_RUN_ENV, run_a)
    with pytest.raises(storage.LeaseLostError, match=f"run {b.holder.run} of "):
        terminal.store_object()
    assert storage.read_text(storage.join(root, "train/v2026.09.21/terminal.json")) == "B"
    monkeypatch.setenv(storage.LEASE_RUN_ENV, b.holder.run)
    terminal.local_path().write_text("B2")
    terminal.store_object()
    assert storage.read_text(storage.join(root, "train/v2026.09.21/terminal.json")) == "B2"
