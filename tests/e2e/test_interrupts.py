"""The kill matrix: SIGINT and SIGKILL of Snakemake, and of its whole process group, during staging, training,
export and eval, on the embedded default run by a real Snakemake.

One run of the graph is interrupted again and again, each time at another stage and in another way, and each
next run is the recovery of the one before (`--rerun-incomplete`, after `--unlock` where Snakemake was killed).
After every interruption: no artifact has a record without its complete payload, no process of the run is left,
and a training resumes from the checkpoint it reached (an interrupt checkpoints the step under way, so it costs
no finished step). The timings of every row are printed (`pytest -s`) for the closing note.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from rlbuild.contracts.artifacts import ARTIFACTS
from rlbuild.contracts.manifest import verify_local
from rlbuild.core.streams import read_stream
from rlbuild.core.wire import RAY_TEMP_DIR_ENV
from rlbuild.stages.basemodel import CACHE_ENV
from tests.conftest import REPO
from tests.e2e.test_pipeline import VERSION, Pipeline, small_experiment
from tests.faults import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
MARK = "RLBUILD_TEST_RUN"
MAX_STEPS = 10  # room for four interrupted trainings that each checkpoint at least one new step
RESUMED = re.compile(r"resumed from \S+/global_step_(\d+) at step")
HOW: dict[str, Callable[[int], None]] = {
    "SIGINT to Snakemake": lambda pid: os.kill(pid, signal.SIGINT),
    "SIGINT to its group": lambda pid: os.killpg(pid, signal.SIGINT),
    "SIGKILL of Snakemake": lambda pid: os.kill(pid, signal.SIGKILL),
    "SIGKILL of its group": lambda pid: os.killpg(pid, signal.SIGKILL),
}


@dataclass(frozen=True)
class Row:
    stage: str  # the `rlbuild` subcommand running when the signal is sent
    how: str  # a key of HOW

    @property
    def killed(self) -> bool:
        return "SIGKILL" in self.how


MATRIX = [
    Row("base-model", "SIGINT to Snakemake"),
    Row("base-model", "SIGKILL of its group"),
    Row("train", "SIGKILL of its group"),
    Row("train", "SIGINT to its group"),
    Row("train", "SIGINT to Snakemake"),
    Row("train", "SIGKILL of Snakemake"),
    Row("export", "SIGINT to Snakemake"),
    Row("export", "SIGKILL of its group"),
    Row("eval", "SIGINT to its group"),
    Row("eval", "SIGKILL of Snakemake"),
]


def processes_of(mark: str) -> list[psutil.Process]:
    """Every live process that inherited the run's mark: Snakemake, its jobs, trainers, Ray's processes."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(MARK) == mark and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
        except psutil.Error:
            continue
    return found


def job_running(mark: str, stage: str) -> bool:
    for process in processes_of(mark):
        try:
            argv = process.cmdline()
        except psutil.Error:
            continue
        if "rlbuild" in argv and stage in argv:
            return True
    return False


def latest_checkpoint(root: Path) -> int:
    latest = root / "tmp" / "ttl=14d" / "train" / f"v{VERSION}" / "checkpoints" / "latest"
    return int(latest.read_text()) if latest.exists() else 0


def assert_every_record_has_its_complete_payload(root: Path) -> None:
    for artifact in ARTIFACTS:
        record, payload = root / artifact.record(VERSION), root / artifact.path(VERSION)
        if not record.exists():
            continue
        assert payload.exists(), f"{record} is there without {payload}"
        if payload.is_dir() and (payload / "manifest.json").exists():
            verify_local(payload)  # raises on a missing or altered file


def ray_session_folder(mark: str) -> str | None:
    """The Ray session folder `rlbuild train` made for the running trainer (its RLBUILD_RAY_TEMP_DIR)."""
    for process in processes_of(mark):
        with contextlib.suppress(psutil.Error):
            if folder := process.environ().get(RAY_TEMP_DIR_ENV):
                return folder
    return None


def pipe_status(pipe: Pipeline) -> str:
    command = [sys.executable, "-m", "rlbuild", "status", "--experiment", str(pipe.experiment)]
    command += ["--storage-root", str(pipe.storage), "--version", VERSION]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False).stdout


def ended(process: subprocess.Popen[bytes]) -> bool:
    return process.poll() is not None


def train_logs(root: Path) -> list[str]:
    attempts = root / "tmp" / "ttl=14d" / "train" / f"v{VERSION}" / "attempts" / "logs"
    return [read_stream(str(f)) or "" for f in sorted(attempts.iterdir())] if attempts.exists() else []


def interrupt(pipe: Pipeline, row: Row, mark: str) -> dict[str, float]:
    """Start (or recover) the run, send the row's signal while its stage runs, and check what is left."""
    command = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "2"]
    command += ["--rerun-incomplete", "--config", f"experiment={pipe.experiment}", f"storage_root={pipe.storage}"]
    command += [f"versions=['{VERSION}']"]
    # The base-model rows interrupt a real warm start: not a copy from the session's cache.
    env = {**{k: v for k, v in os.environ.items() if k != CACHE_ENV}, MARK: mark}
    log = pipe.folder / f"snakemake-{mark}.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            command, cwd=pipe.folder, env=env, start_new_session=True, stdout=out, stderr=subprocess.STDOUT
        )
    checkpoint_before = latest_checkpoint(pipe.root)
    if row.stage == "train":  # a checkpoint newer than the last run's: there is progress an interrupt could lose
        reached = wait_until(lambda: latest_checkpoint(pipe.root) > checkpoint_before or ended(process), 600, 0.2)
    else:
        reached = wait_until(lambda: job_running(mark, row.stage) or ended(process), 600, poll=0.02)
    assert reached and not ended(process), f"{row}: the stage never ran: {log.read_text()[-3000:]}"
    at_signal = latest_checkpoint(pipe.root)
    ray_folder = ray_session_folder(mark) if row.stage == "train" else None
    sent = time.monotonic()
    HOW[row.how](process.pid)
    code = process.wait(timeout=300)
    exited = time.monotonic() - sent
    # Where the run's exit is Snakemake's (it waits for its jobs, or dies with them), nothing of it, Ray's
    # processes included, is alive 5 s later; where Snakemake alone died, its jobs first finish their step.
    gone = wait_until(lambda: not processes_of(mark), 120 if row.how == "SIGKILL of Snakemake" else 5, poll=0.2)
    left = processes_of(mark)
    for straggler in left:  # leave a clean machine for the tests after this one, then fail
        straggler.kill()
    assert gone, f"{row}: processes outlived the run: {[(p.pid, p.name()) for p in left]}"
    assert ray_folder is None or not os.path.exists(ray_folder), f"{row}: Ray's session folder {ray_folder} is left"
    assert_every_record_has_its_complete_payload(pipe.root)
    if not row.killed:  # stopped, not crashed: one line of ours says where and how to resume, then death by SIGINT
        said = log.read_text()
        assert code == -signal.SIGINT, f"{row}: exit {code}: {said[-3000:]}"  # a shell's 130
        for crash in ("Error in rule", "RuleException", "CalledProcessError", "WorkflowError", "Traceback"):
            assert crash not in said, f"{row}: {crash!r} in {said[-3000:]}"
        last = said.strip().splitlines()[-1]
        assert last.startswith("rlbuild: interrupted (SIGINT): stopped ") and "run the same command again" in last
    if row.stage == "train" and not row.killed:
        # Interrupted, not killed: the step under way was checkpointed before the trainer exited.
        step = latest_checkpoint(pipe.root)
        assert step >= at_signal
        assert "stopped: interrupted" in train_logs(pipe.root)[-1]
        assert f"train/v{VERSION} at step {step}, last checkpoint " in last, last
        if row.how == "SIGINT to its group":  # what `rlbuild status` says of it: no ETA, resumable
            status = pipe_status(pipe)
            assert f"verdict: interrupted at step {step}, resumable" in status and "ETA" not in status, status
    if row.killed:
        assert pipe.run("--unlock").returncode == 0
    return {"exit_s": exited, "cleanup_s": time.monotonic() - sent, "checkpoint": float(latest_checkpoint(pipe.root))}


def test_kill_matrix(tmp_path: Path) -> None:
    pipe = Pipeline(tmp_path, small_experiment(tmp_path, max_steps=MAX_STEPS, name="kills"))
    doc = yaml.safe_load(pipe.experiment.read_text())
    doc["recipe"]["trainer"]["ckpt_interval"] = 1
    pipe.experiment.write_text(yaml.safe_dump(doc, sort_keys=False))
    timings = []
    for row in MATRIX:
        timings.append((row, interrupt(pipe, row, uuid.uuid4().hex)))
    mark = uuid.uuid4().hex
    finished = pipe.run("--rerun-incomplete", env={MARK: mark})
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert not processes_of(mark)
    assert_every_record_has_its_complete_payload(pipe.root)
    for artifact in ARTIFACTS:
        assert (pipe.root / artifact.record(VERSION)).exists(), artifact.kind
    terminal = pipe.root / f"train/v{VERSION}/terminal.json"
    assert json.loads(terminal.read_text())["global_step"] == MAX_STEPS

    # Nothing trained twice beyond the last checkpoint: each training attempt after the first resumed from the
    # newest checkpoint there was when the one before it stopped (a training that reached its last step before
    # its job stopped is not resumed: its terminal manifest is written from the final checkpoint).
    logs = train_logs(pipe.root)
    resumed = [int(m[1]) for text in logs if (m := RESUMED.search(text))]
    checkpoints_at_stop = [int(t["checkpoint"]) for r, t in timings if r.stage == "train"]
    assert resumed == [step for step in checkpoints_at_stop if step < MAX_STEPS]
    print("\nkill matrix (stage | how | Snakemake exited after | no process left after | checkpoint after)")
    for row, t in timings:
        print(f"{row.stage:10} | {row.how:22} | {t['exit_s']:6.1f} s | {t['cleanup_s']:6.1f} s | {t['checkpoint']:.0f}")
