"""'To be continued' without a scheduler: the trainer stops at a step boundary once its hand-over time has passed
(RLBUILD_STOP_AT, what the Slurm chain passes) or on SIGUSR1, checkpoints that step, exits 75; the next run resumes
from that checkpoint and trains each remaining step once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlbuild.core.wire import CONTINUE_EXIT_CODE, STOP_AT_ENV
from rlbuild.dev.launches import write_test_launch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def trainer(launch: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", "--launch", str(launch)],
        env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_hand_over_checkpoints_the_step_exits_75_and_the_next_run_resumes_there(tmp_path: Path) -> None:
    launch = write_test_launch(tmp_path, recipe={"trainer": {"max_steps": 4, "ckpt_interval": 100}})
    artifacts = yaml.safe_load(launch.read_text())["artifacts"]
    first = trainer(launch, {STOP_AT_ENV: "0"})  # the hand-over time has long passed
    out, _ = first.communicate(timeout=300)
    assert first.returncode == CONTINUE_EXIT_CODE, out[-3000:]
    assert "[trainer] to be continued: hand-over time" in out and "checkpoint of step 1 at" in out
    assert Path(artifacts["checkpoint_root"], "latest").read_text() == "1"
    assert not Path(artifacts["terminal_manifest_uri"]).exists()

    second = trainer(launch, {})
    out, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out[-3000:]
    assert "[trainer] resumed from" in out and "at step 1" in out
    assert [int(line.split("/")[0].rsplit(" ", 1)[-1]) for line in out.splitlines() if "[trainer] step " in line] == [
        2,
        3,
        4,
    ]
    assert json.loads(Path(artifacts["terminal_manifest_uri"]).read_text())["global_step"] == 4


def test_sigusr1_stops_after_the_step_under_way(tmp_path: Path) -> None:
    launch = write_test_launch(tmp_path, recipe={"trainer": {"max_steps": 500, "ckpt_interval": 1000}})
    process = trainer(launch, {})
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if "[trainer] step 2/" in line:
            process.send_signal(signal.SIGUSR1)
            signalled = time.monotonic()
            break
    rest, _ = process.communicate(timeout=120)
    out = "".join(lines) + rest
    assert process.returncode == CONTINUE_EXIT_CODE, out[-3000:]
    assert "wall-clock warning (SIGUSR1) received" in out
    stopped = int(out.split("checkpoint of step ")[1].split(" ")[0])
    assert 2 <= stopped <= 4 and time.monotonic() - signalled < 120
