"""`rlbuild status`'s judgement from what it reads, without a run: the stall threshold follows the measured step
time, a node's clock ahead of this one never makes an age negative, and a storage root that cannot be a location
is bad input (exit 2), not an experiment with nothing built."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlbuild.contracts.launch import load_launch
from rlbuild.contracts.progress import progress_uri
from rlbuild.core import storage
from rlbuild.dev.launches import write_test_launch
from rlbuild.ops.status import STALL_AFTER_S, STALL_FLOOR_S, Options, pace, stall_threshold, train_ladder, verdict

REPO = Path(__file__).resolve().parents[2]


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
