"""`rlbuild status` on real local runs: a training that advances, a paused trainer reported as stalled, and the
run SIGKILLed reported failed (owner gone), not starting or healthy on its leftover lease and progress; and status
agreeing with Snakemake's own dry run on what a retrain left to rebuild."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rlbuild.contracts.artifacts import artifact
from rlbuild.core import storage
from rlbuild.dev.built import write_built
from rlbuild.plan.identity import derived_record
from tests.conftest import REPO
from tests.e2e.test_pipeline import VERSION, Pipeline, ran, small_experiment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def status(experiment: Path, storage_root: Path, *extra: str) -> dict[str, Any]:
    argv = [sys.executable, "-m", "rlbuild", "status", "--json", "--experiment", str(experiment)]
    argv += ["--storage-root", str(storage_root), "--version", VERSION, *extra]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def train_entry(document: dict[str, Any]) -> dict[str, Any]:
    return document["versions"][VERSION]["train"]


def wait_for(predicate, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_status_follows_a_training_and_reports_a_paused_trainer_as_stalled(tmp_path: Path) -> None:
    experiment = small_experiment(tmp_path, max_steps=400, name="watched")
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), "--cores", "2"]
    argv += ["--config", f"experiment={experiment}", f"storage_root={results}", f"versions=['{VERSION}']"]
    argv += ["--", f"train/v{VERSION}/terminal.json"]
    process = subprocess.Popen(
        argv, cwd=tmp_path, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    trainer = None
    try:

        def stepping(at_least: int) -> dict[str, Any] | None:
            entry = train_entry(status(experiment, results))
            step = (entry.get("ladder") or {}).get("last_step") or 0
            return entry if entry["state"] == "running" and step >= at_least else None

        first = wait_for(lambda: stepping(1), 400, "a running train with a step")
        assert first["verdict"] == "healthy", first
        assert first["holder"]["pid"], first  # the lease names the run building it
        later = wait_for(lambda: stepping(first["ladder"]["last_step"] + 2), 120, "the step to advance")
        assert later["ladder"]["steps_per_min"] > 0 and later["ladder"]["eta_s"] > 0
        root = results / "watched" / "tmp" / "ttl=14d" / "train" / f"v{VERSION}" / "attempts"
        trainer = int(json.loads((root / "progress.json").read_text())["pid"])
        os.kill(trainer, signal.SIGSTOP)  # the trainer hangs: no more steps, the run's lease still heartbeats
        time.sleep(4)  # past the 3 s asked for below: the last step's progress is older than the pause
        stalled = train_entry(status(experiment, results, "--stall-after", "3"))
        assert stalled["state"] == "running"
        assert stalled["verdict"].startswith("stalled: no step for ") and " min " in stalled["verdict"], stalled
        text = subprocess.run(
            [
                sys.executable,
                "-m",
                "rlbuild",
                "status",
                "--experiment",
                str(experiment),
                "--storage-root",
                str(results),
                "--version",
                VERSION,
                "--stall-after",
                "3",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
            cwd=REPO,
        ).stdout
        assert "verdict: stalled: no step for" in text and "steps      " in text, text
    finally:
        if trainer is not None:
            os.kill(trainer, signal.SIGCONT)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    assert storage.exists(str(results / "watched" / "train" / f"v{VERSION}.identity.json")) is False
    # SIGKILLed: the lease still names the dead Snakemake (its heartbeat seconds old), the progress a dead trainer.
    gone = status(experiment, results)
    entry = train_entry(gone)
    assert entry["state"] == "failed" and "(owner gone)" in entry["verdict"], entry
    assert f"pid {process.pid} no longer runs" in entry["verdict"] and gone["verdict"] == entry["verdict"], gone


def test_a_version_that_cannot_be_resolved_is_bad_input_not_a_verdict(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "rlbuild", "status", "--storage-root", str(tmp_path), "--version", "2026.13.40"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "month must be in 1..12" in result.stdout
    assert "verdict: invalid: version 2026.13.40 cannot be resolved" in result.stdout


def test_status_and_a_dry_run_agree_on_what_a_retrain_left_stale(tmp_path: Path) -> None:
    """A completed version (written directly: rlbuild/dev/built.py), then what `snakemake --forcerun train --config
    allow_retrain=true -- train/v<V>/terminal.json` leaves: a new terminal.json and train record, the export and
    eval of the earlier training. Snakemake would rebuild export and eval (their input is newer); so says status."""
    experiment = small_experiment(tmp_path, name="retrained")
    pipe = Pipeline(tmp_path, experiment)
    write_built(experiment, str(pipe.storage), [VERSION])
    assert ran(pipe.run("-n")) == {} and status(experiment, pipe.storage)["verdict"] == "done"
    time.sleep(1.1)  # records are stamped to the second, file times finer: the retrain comes a second later
    train = artifact("train")
    (pipe.root / train.path(VERSION)).write_text("{}\n")  # the train job's outputs: terminal.json, then its record
    launch = json.loads((pipe.root / artifact("launch").record(VERSION)).read_text())
    (pipe.root / train.record(VERSION)).write_text(json.dumps(derived_record(launch, "train"), indent=2))
    assert ran(pipe.run("-n")) == {"export": 1, "eval": 1, "all": 1}
    document = status(experiment, pipe.storage)
    kinds = document["versions"][VERSION]
    assert kinds["train"]["state"] == "done", kinds["train"]
    assert kinds["export"]["state"] == "stale", kinds["export"]
    assert f"from train/v{VERSION}, which was rebuilt at " in kinds["export"]["stale_because"], kinds["export"]
    assert kinds["eval"]["stale_because"] == f"built from export/v{VERSION}, which is stale now", kinds["eval"]
    assert document["verdict"].startswith("stale: export (built at "), document["verdict"]
