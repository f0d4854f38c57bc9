"""`rlbuild status`'s judgement from what it reads, without a run: the stall threshold follows the measured step
time, a node's clock ahead of this one never makes an age negative, a storage root that cannot be a location is
bad input (exit 2), not an experiment with nothing built; and a table of what storage can hold (records, leases,
progress, checkpoints, written by their real writers) with the one state and verdict each must give: stale below
a rebuilt upstream, leased until a process confirms a job, failed when the owner is gone, a checkpoint never ahead
of the step, an ETA from the trainer's own rate."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rlbuild.contracts.artifacts import ARTIFACTS, artifact, sealed, sha256_bytes
from rlbuild.contracts.launch import load_launch
from rlbuild.contracts.metricstream import MetricsStream
from rlbuild.contracts.progress import Progress, progress_uri
from rlbuild.core import storage
from rlbuild.core.streams import StreamWriter
from rlbuild.dev.built import write_built
from rlbuild.dev.launches import write_test_launch
from rlbuild.job.attempt import log_uri
from rlbuild.ops.lease import Holder, Leases, held_leases, lease_uri
from rlbuild.ops.status import (
    BUILT_FROM,
    STALL_AFTER_S,
    STALL_FLOOR_S,
    Options,
    overall,
    pace,
    stall_threshold,
    target_selection,
    train_ladder,
    verdict,
    version_status,
)
from rlbuild.ops.statusview import format_status
from rlbuild.plan.identity import derived_record
from rlbuild.plan.preflight import load_experiment
from rlbuild.plan.resolve import Plan, resolve
from rlbuild.workflow import Graph
from trainer.checkpoint import CheckpointManager

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = REPO / "config" / "experiments" / "tiny-addition.yaml"
VERSION = "2026.09.21"


def test_the_stall_threshold_is_twenty_measured_steps_at_least_a_minute_else_ten_minutes() -> None:
    assert stall_threshold(Options(), None) == STALL_AFTER_S == 600
    assert stall_threshold(Options(), 0.3) == STALL_FLOOR_S == 60  # a tiny model's step: the floor
    assert stall_threshold(Options(), 45.0) == 900  # an 8B step: 20 of them
    assert stall_threshold(Options(stall_after_s=3), 45.0) == 3  # asked for: as asked


def test_a_trainer_paused_for_90_s_at_a_fast_step_time_is_stalled() -> None:
    records = [{"step": s, "perf/step_time_s": 0.4} for s in range(1, 30)]
    ladder = {"last_step": 29, "last_step_age_s": 90.0, **pace(records, 100, 29)}
    ladder["stall_after_s"] = stall_threshold(Options(), ladder["step_time_s"])
    assert ladder["step_time_s"] == 0.4 and ladder["eta_s"] == 28
    assert verdict("running", ladder, {"state": "running"}, Options()).startswith("stalled: no step for 1.5 min")
    ladder["last_step_age_s"] = 30.0
    assert verdict("running", ladder, {"state": "running"}, Options()) == "healthy"


def test_an_age_is_never_negative_when_the_nodes_clock_is_ahead(tmp_path: Path) -> None:
    launch = load_launch(str(write_test_launch(tmp_path)))
    now = time.time()
    # What the trainer publishes, stamped by a node whose clock runs two hours ahead of this machine's.
    storage.write_json(progress_uri(launch.artifacts.attempts_root), {"step": 110, "time": now + 7200})
    ladder = train_ladder(launch, {"state": "running"}, Options(), now)["ladder"]
    assert ladder["last_step"] == 110 and ladder["last_step_age_s"] == 0.0


@pytest.mark.parametrize("root", ["s3:///", "s3:///p", "s3://.../...", "gs://bucket/p", "s3://B/p"])
def test_a_storage_root_that_cannot_be_a_location_is_bad_input(root: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "rlbuild", "status", "--storage-root", root]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"{root!r} is not a storage location" in result.stderr and "RLBUILD_BUCKET" in result.stderr
    assert "Traceback" not in result.stderr and "artifacts not built" not in result.stdout


@dataclass
class Built:
    """A version of tiny-addition built an hour ago under tmp_path, and the leases and processes of a run on it."""

    plan: Plan
    leases: Leases
    children: list[subprocess.Popen[bytes]]

    def record_uri(self, kind: str) -> str:
        return self.plan.uri(artifact(kind).record(VERSION))

    def record(self, kind: str) -> dict[str, Any]:
        return json.loads(storage.read_text(self.record_uri(kind)) or "{}")

    def write_record(self, kind: str, record: dict[str, Any]) -> None:
        """As a job writes it: sealed, with the digests of its documents the record already names."""
        document = sealed(record, record.get("payload"))
        storage.write_text(self.record_uri(kind), json.dumps(document, indent=2, sort_keys=True))

    def unbuild(self, *kinds: str) -> None:
        """What Snakemake leaves of an artifact it reruns: its outputs, and with them its record, removed."""
        for kind in kinds:
            storage.remove(self.record_uri(kind))

    def lease(self, *kinds: str) -> None:
        """This process takes the leases, as a Snakemake run does at `onstart` (rlbuild/workflow.py)."""
        for kind in kinds:
            self.leases.acquire(lease_uri(self.plan.experiment_root, kind, VERSION), kind)

    def job(self, kind: str) -> None:
        """The run's job for `kind` runs: a child of this process with the rule's `--record <record>`."""
        command = ["--record", artifact(kind).record(VERSION)]
        self.children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", *command]))

    def status(self) -> dict[str, Any]:
        leases = held_leases(self.plan.experiment_root)
        return version_status(self.plan, leases, None, Options(), time.time())


@pytest.fixture
def built(tmp_path: Path) -> Iterator[Built]:
    root = str(tmp_path / "results")
    write_built(EXPERIMENT, root, [VERSION])
    plan = resolve(load_experiment(EXPERIMENT), VERSION, root)
    found = Built(plan, Leases(), [])
    an_hour_ago = (datetime.now(UTC) - timedelta(hours=1)).isoformat(timespec="seconds")
    for kind in plan.records:
        found.write_record(kind, found.record(kind) | {"created_at": an_hour_ago})
    yield found
    found.leases.release_all()
    for child in found.children:
        child.kill()
        child.wait()


def terminal(b: Built, saved_at: datetime) -> None:
    """The train job's outputs: its final checkpoint (saved at `saved_at`), terminal.json naming it, its record."""
    a = b.plan.launch.artifacts
    saved = {"created_at": saved_at.strftime("%Y-%m-%dT%H:%M:%SZ")}
    checkpoint = CheckpointManager(a.checkpoint_root, 2, "digest").save(4, 0, saved, lambda uri: {})
    storage.write_json(b.plan.uri(artifact("train").path(VERSION)), {"global_step": 4, "checkpoint_path": checkpoint})
    b.write_record("train", derived_record(b.record("launch"), "train"))


def retrained(b: Built) -> None:
    """`snakemake --forcerun train --config allow_retrain=true -- train/v<V>/terminal.json`: the train job trained
    from step 0 and wrote its outputs again (now); export and eval kept theirs (an hour old)."""
    terminal(b, datetime.now(UTC))


def reemitted(b: Built) -> None:
    """A rerun of train that trains nothing (`--rerun-incomplete` after Snakemake was killed as the training
    finished): terminal.json written again, the same bytes, from the final checkpoint saved two hours ago, before
    export and eval were built; Snakemake compares terminal.json's checksum and rebuilds neither."""
    terminal(b, datetime.now(UTC) - timedelta(hours=2))


def exported_from_another_launch(b: Built) -> None:
    b.write_record(
        "export", b.record("export") | {"deps": {"launch": "tiny-addition/launch@2026.09.21:0123456789abcdef"}}
    )


def retraining(b: Built) -> None:
    """The retrain's run took its leases; Snakemake removed train's outputs and runs its job: no trainer yet."""
    b.lease("train", "export", "eval")
    b.unbuild("train")
    b.job("train")


def leased_behind_train(b: Built) -> None:
    """A live run holds every lease from train on; none of its jobs started (a remote executor's, or queued)."""
    b.unbuild("train", "export", "eval")
    b.lease("train", "export", "eval")


def exporting(b: Built) -> None:
    b.unbuild("export", "eval")
    b.lease("export", "eval")
    b.job("export")


def killed(b: Built) -> None:
    """A run SIGKILLed while training started: its lease (heartbeat fresh) and progress name a dead pid."""
    b.unbuild("train", "export", "eval")
    code = (
        "import os, signal, sys\n"
        "from rlbuild.contracts.progress import Progress\n"
        "from rlbuild.ops.lease import Leases\n"
        "Leases().acquire(sys.argv[1], 'train')\n"
        "Progress(sys.argv[2], 100).started(0)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    uri = lease_uri(b.plan.experiment_root, "train", VERSION)
    result = subprocess.run([sys.executable, "-c", code, uri, b.plan.launch.artifacts.attempts_root], cwd=REPO)
    assert result.returncode == -9


def heartbeat_stopped(b: Built) -> None:
    """The run on another machine stopped refreshing its lease five minutes ago (its machine died). That machine's
    clock ran an hour ahead, so the heartbeat time it wrote lies in the future: storage's clock judges the age."""
    b.unbuild("train", "export", "eval")
    holder = json.loads(Holder(host="node-7").document()) | {"heartbeat_epoch": time.time() + 3600}
    uri = lease_uri(b.plan.experiment_root, "train", VERSION)
    storage.write_json(uri, holder)
    five_minutes_ago = time.time() - 300
    os.utime(uri, (five_minutes_ago, five_minutes_ago))  # the object's last write, as the filesystem tells it


def checkpointed_before_progress(b: Built) -> None:
    """The trainer saved the checkpoint of step 120 and has not yet published the step (it does so after)."""
    b.unbuild("train", "export", "eval")
    b.lease("train")
    a = b.plan.launch.artifacts
    Progress(a.attempts_root, 200).step(110, force=True)
    CheckpointManager(a.checkpoint_root, 2, "digest").save(120, 0, {}, lambda uri: {})


def stepping_at_two_seconds_a_step(b: Built) -> None:
    """Attempt started 100 s ago at step 0, now at step 50 (2 s a step with its evals); the metric stream's step
    time (compute only, 0.4 s) is not the rate the run goes at."""
    b.unbuild("train", "export", "eval")
    b.lease("train")
    b.job("train")
    a = b.plan.launch.artifacts
    stream = MetricsStream(a.metrics_segments_root, -1)
    for step in range(1, 51):
        stream.append({"step": step, "perf/step_time_s": 0.4})
    stream.flush()
    progress = Progress(a.attempts_root, 100)
    progress.attempt_started -= 100
    progress.step(50, force=True)


def attempt_ended(b: Built, code: int, last_line: str, checkpoint: int | None = None) -> None:
    """The last training attempt's log, as `rlbuild train` keeps it, ends with `last_line` and exit `code`; the
    run released its leases (Snakemake's `onerror`)."""
    b.unbuild("train", "export", "eval")
    a = b.plan.launch.artifacts
    if checkpoint is not None:
        CheckpointManager(a.checkpoint_root, 2, "digest").save(checkpoint, 0, {}, lambda uri: {})
    attempt = "20260921T101500Z-host-1a2b3c"
    with StreamWriter(log_uri(a.attempts_root, attempt), flush_s=60) as log:
        log.write(f"{last_line}\n[rlbuild] attempt {attempt} exited with code {code}\n")


def interrupted(b: Built) -> None:
    """Ctrl-C: the trainer checkpointed step 3, the step under way, and exited 130."""
    attempt_ended(b, 130, "[trainer] stopped: interrupted (SIGTERM at 10:15:00); run again to resume", checkpoint=3)


def disk_full(b: Built) -> None:
    """The disk filled while the trainer wrote a checkpoint."""
    path = f"{b.plan.launch.artifacts.checkpoint_root}/global_step_4/sharded/__0_0.distcp"
    attempt_ended(b, 2, f"error: OSError: [Errno 28] No space left on device: '{path}'", checkpoint=2)


REBUILT = re.escape(f"from train/v{VERSION}, which was rebuilt at ")
CASES: dict[str, tuple[Callable[[Built], None], dict[str, str], str]] = {
    # scenario: (what storage holds, {kind: state or "state: reason pattern"}, verdict pattern)
    "built": (lambda b: None, {"eval": "done"}, "done$"),
    "retrained": (
        retrained,
        {
            "train": "done",
            "export": f"stale: built at .* {REBUILT}",
            "eval": f"stale: built from export/v{VERSION}, which is stale now",
        },
        f"stale: export \\(built at .* {REBUILT}.*eval",
    ),
    "re-emitted terminal": (reemitted, {"train": "done", "export": "done", "eval": "done"}, "done$"),
    "deps name another identity": (
        exported_from_another_launch,
        {"export": "stale: built from tiny-addition/launch@2026.09.21:0123456789abcdef, but launch/v", "eval": "stale"},
        "stale: export",
    ),
    "retraining": (
        retraining,
        {"train": "running", "export": "stale: .*which is running now", "eval": "stale"},
        "starting: no step yet",
    ),
    "leased behind train": (
        leased_behind_train,
        {"train": "leased", "export": f"leased: .*waits for train/v{VERSION} \\(leased\\)", "eval": "leased"},
        f"leased: train/v{VERSION}, export/v{VERSION}, eval/v{VERSION} held by a live run",
    ),
    "exporting": (exporting, {"train": "done", "export": "running", "eval": "leased"}, "running$"),
    "heartbeat stopped": (heartbeat_stopped, {"train": "failed: stopped heartbeating 5 min ago"}, "(owner gone)"),
    "interrupted": (
        interrupted,
        {"train": "interrupted: interrupted at step 3, resumable", "export": "missing"},
        "^interrupted at step 3, resumable: a rerun resumes from its checkpoint of step 3$",
    ),
    "disk full": (
        disk_full,
        {"train": "failed: no space left on device writing .*/global_step_4/sharded/__0_0.distcp \\(attempt .* 2\\)"},
        "^failed: no space left on device writing ",
    ),
    "killed": (
        killed,
        {"train": "failed", "export": "missing"},
        "failed: the run building it is gone: pid .*(owner gone)",
    ),
}


@pytest.mark.parametrize("scenario", list(CASES))
def test_each_state_is_claimed_only_on_its_evidence(scenario: str, built: Built) -> None:
    make, expected, judged = CASES[scenario]
    make(built)
    entries = built.status()
    for kind, want in expected.items():
        state, _, why = want.partition(": ")
        entry = entries[kind]
        assert entry["state"] == state, (kind, entry)
        if why:
            assert re.search(why, str(entry.get("stale_because") or entry.get("verdict"))), (kind, entry)
    assert re.search(judged, overall({VERSION: entries})), overall({VERSION: entries})
    if scenario == "interrupted":  # nothing runs: no rate, no ETA, and the view says so without one
        assert entries["train"]["ladder"]["eta_s"] is None
        text = format_status({"experiment": "e", "storage_root": "r", "versions": {VERSION: entries}, "verdict": "-"})
        assert "ETA" not in text and "interrupted at step 3, resumable" in text, text
    if scenario == "killed":  # a fresh heartbeat and a started trainer do not make a dead run healthy or starting
        assert "starting" not in entries["train"]["verdict"] and "healthy" not in entries["train"]["verdict"]


def test_the_checkpoint_shown_never_runs_ahead_of_the_step(built: Built) -> None:
    checkpointed_before_progress(built)
    ladder = built.status()["train"]["ladder"]
    assert ladder["last_checkpoint"] == 120 and ladder["last_step"] == 120, ladder
    assert ladder["last_step_age_s"] < 5  # the checkpoint's own time, not the older progress document's


def test_steps_per_minute_and_eta_are_the_trainers_own_rate(built: Built) -> None:
    stepping_at_two_seconds_a_step(built)
    entry = built.status()["train"]
    ladder = entry["ladder"]
    assert entry["state"] == "running" and ladder["step_time_s"] == 0.4, entry  # its job runs
    assert ladder["steps_per_min"] == 30.0 and ladder["eta_s"] == 100, ladder  # 2 s a step, 50 steps to go


def test_a_failed_detached_coordinator_makes_the_verdict_failed(built: Built) -> None:
    built.unbuild("eval")
    entries = built.status()
    coordinator = {"job": "/alice/rlbuild-tiny-0123", "scheduler": "iris", "targets": [f"eval/v{VERSION}/results.json"]}
    failed = [coordinator | {"job_state": "killed", "job_phase": "failed"}]
    assert overall({VERSION: entries}, failed).startswith(
        "failed: coordinator Iris job /alice/rlbuild-tiny-0123 is killed"
    )
    running = [coordinator | {"job_state": "running", "job_phase": "running"}]
    assert overall({VERSION: entries}, running) == "1 of 7 artifacts not built"
    retrained_since = {VERSION: built.status() | {"eval": {"state": "done"}}}
    assert overall(retrained_since, failed) == "done"  # a later run built what it failed to: nothing is failed now


def test_built_from_is_what_the_rules_take_as_inputs() -> None:
    """Staleness mirrors Snakemake's mtime trigger over each rule's artifact inputs (stage_model's base_model
    comes from its input function, only where the model is built from one)."""
    rules = "\n".join(path.read_text() for path in sorted((REPO / "rules").glob("*.smk")))
    kind_of_rule = {a.rule: a.kind for a in ARTIFACTS}
    found: dict[str, tuple[str, ...]] = {}
    for name, body in re.findall(r"^rule (\w+):\n(.*?)(?=^rule |\Z)", rules, re.S | re.M):
        inputs = body.split("input:", 1)[1].split("output:", 1)[0] if "input:" in body else ""
        # A shared stage is an input function's (GRAPH.stage: a series' arm may use another key's).
        kinds = tuple(dict.fromkeys(re.findall(r'(?:ARTIFACT\[|GRAPH\.stage\()"(\w+)"', inputs)))
        if name in kind_of_rule and kinds:
            found[kind_of_rule[name]] = kinds
    found["stage_model"] = ("base_model",)
    assert 'artifact("base_model")' in inspect.getsource(Graph.stage_model_inputs)
    assert {k: set(v) for k, v in found.items()} == {k: set(v) for k, v in BUILT_FROM.items()}


@pytest.mark.parametrize("name", ["terminal.json", "record"])
def test_an_edited_train_document_or_record_is_corrupt_naming_it_and_nothing_below_is_done(
    built: Built, name: str
) -> None:
    if name == "record":
        uri = built.record_uri("train")
        storage.write_text(uri, (storage.read_text(uri) or "").replace(VERSION, "2026.09.22", 1))
    else:
        uri = built.plan.uri(artifact("train").path(VERSION))
        storage.write_text(uri, '{"global_step": 5}\n')
    entries = built.status()
    assert entries["train"]["state"] == "corrupt" and uri in entries["train"]["verdict"], entries["train"]
    assert "ladder" not in entries["train"]  # a corrupt train is not judged as a running or failed one
    assert entries["export"]["state"] == entries["eval"]["state"] == "stale"
    assert overall({VERSION: entries}).startswith(f"corrupt: {uri} is corrupt")


def test_a_status_target_names_its_version_key_whether_folder_file_or_record() -> None:
    """`rlbuild status <target>`: a record's path names the same version as its folder's (not `v….identity.json`)."""
    assert target_selection(["launch/v2026.09.21.identity.json"])[0] == ["2026.09.21"]
    assert target_selection(["eval/v2026.09.21/results.json", "export/v2026.09.21@kl-low"])[0] == [
        "2026.09.21",
        "2026.09.21@kl-low",
    ]


def test_status_verify_reads_the_final_checkpoints_shards_and_names_a_flipped_one(built: Built) -> None:
    """A bit flip in a `*.distcp` shard of the final checkpoint: plain status (which reads no shard) says done,
    `--verify` says corrupt, naming the file, as a resume from it would refuse it."""
    a = built.plan.launch.artifacts
    shard = b"rank 0's weights and AdamW moments" * 64

    def write_shards(uri: str) -> dict[str, Any]:
        storage.write_bytes(storage.join(uri, "sharded", "__0_0.distcp"), shard)
        return {"sharded/__0_0.distcp": {"sha256": sha256_bytes(shard), "size": len(shard)}}

    checkpoint = CheckpointManager(a.checkpoint_root, 2, "digest").save(4, 0, {}, write_shards)
    terminal_uri = built.plan.uri(artifact("train").path(VERSION))
    storage.write_json(terminal_uri, {"global_step": 4, "checkpoint_path": checkpoint})
    built.write_record("train", derived_record(built.record("launch"), "train"))
    verified = version_status(built.plan, {}, ["train"], Options(verify=True), time.time())
    assert verified["train"]["state"] == "done", verified
    flipped = bytearray(shard)
    flipped[len(flipped) // 2] ^= 0x01
    storage.write_bytes(storage.join(checkpoint, "sharded", "__0_0.distcp"), bytes(flipped))
    assert built.status()["train"]["state"] == "done"  # without --verify no shard is read
    verified = version_status(built.plan, {}, ["train"], Options(verify=True), time.time())
    assert verified["train"]["state"] == "corrupt", verified
    assert re.search(r"sharded/__0_0\.distcp: sha256 .*resume from another checkpoint", verified["train"]["verdict"])


def test_the_checks_of_a_fixed_version_refuse_every_document_status_names_corrupt_at_once(built: Built) -> None:
    """`rlbuild check` and the dry run (both `checked_plan`) refuse what status shows `corrupt`, by the same
    verification (`StoredRecords.corrupt`): every edited document at once, each naming its file and the fix."""
    from rlbuild.plan.series import check
    from rlbuild.plan.spec import NodeLimits
    from rlbuild.plan.versioning import check_all

    edited = [built.plan.uri(artifact(kind).path(VERSION)) for kind in ("launch", "eval")]
    for uri in edited:
        storage.write_text(uri, "edited: by hand\n")
    root = built.plan.experiment_root.rsplit("/", 1)[0]
    _, problems, _ = check_all(
        check(load_experiment(EXPERIMENT)), [VERSION], root, "x.yaml", NodeLimits(None, None, None)
    )
    assert [p.field for p in problems] == ["launch", "eval"], problems
    for uri, problem in zip(edited, problems, strict=True):
        assert problem.message.startswith(f"{uri} is corrupt: its sha256 is"), problem
        assert "restore it, or delete the artifact's record" in problem.fix
    entries = built.status()
    assert [entries[kind]["state"] for kind in ("launch", "eval")] == ["corrupt", "corrupt"]
