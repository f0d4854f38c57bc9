"""`rlbuild status` on a real agent train whose sandboxes stop answering: the tiny agent trains find_key in real
local sandboxes, and from its second step on every episode's command outlives `command_timeout_s`
(tests/e2e/starving_agent.py), so the trainer's process lives and its steps crawl while no episode finishes.
Lifecycle state says running; status must say `stalled` (no episodes finished, naming the sandbox errors), with
no ETA, within the experiment's `execution.episode_stall_after_s`, read through the public command while the train
is live. The train is then stopped by its process group."""

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
import yaml

from rlbuild.contracts.launch import load_launch
from rlbuild.contracts.progress import MIN_INTERVAL_S
from rlbuild.dev.launches import base_model_dir, experiment_document, write_test_launch
from rlbuild.plan.series import deep_merge
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STALL_AFTER_S = 5.0  # execution.episode_stall_after_s: seconds here, where a real run keeps the default 12 minutes
VERSION = "dev"


def _experiment() -> dict[str, Any]:
    """The shipped tiny-agent (its seed, base model, split and recipe; 4 prompts x 8 samples a step) with the
    starving environment, a 1 s command limit and the short stall bound (placement: the launch is the same)."""
    shipped = yaml.safe_load((REPO / "config" / "experiments" / "tiny-agent.yaml").read_text())
    recipe = {
        "trainer": {"max_steps": 500, "ckpt_interval": 500, "eval_interval": -1, "eval_before_train": False},
        "environment": {"env_class": "tests.e2e.starving_agent:StarvingFindKey", "sandbox": {"command_timeout_s": 1}},
    }
    return {
        "task": "find_key",
        "seed": shipped["seed"],
        "data_seed": int(shipped["data"]["train"][0]["revision"].removeprefix("seed-")),
        "role_plan": {**shipped["role_plan"], "train_batch_size": 4, "policy_mini_batch_size": 4},
        "recipe": deep_merge(shipped["recipe"], recipe),
        "model_dir": base_model_dir(shipped["seed"], shipped["model"]["revision"]),
        "execution": {"episode_stall_after_s": STALL_AFTER_S},
    }


def _status(experiment: Path, storage_root: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "rlbuild", "status", "--experiment", str(experiment)]
    argv += ["--storage-root", str(storage_root), "--version", VERSION, *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=REPO)


def _train_entry(experiment: Path, storage_root: Path) -> tuple[dict[str, Any], str]:
    result = _status(experiment, storage_root, "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    return document["versions"][VERSION]["train"], document["verdict"]


def _step(progress: Path) -> int:
    try:
        return int(json.loads(progress.read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def test_a_train_whose_sandboxes_stop_answering_is_reported_stalled(tmp_path: Path) -> None:
    settings = _experiment()
    launch = load_launch(str(write_test_launch(tmp_path, version=VERSION, **settings)))
    experiment = tmp_path / "starving.yaml"
    experiment.write_text(yaml.safe_dump(experiment_document(tmp_path.resolve() / "sources", **settings)))
    storage_root = tmp_path.resolve() / "storage"
    progress = Path(launch.artifacts.attempts_root) / "progress.json"
    with (tmp_path / "trainer.log").open("w") as log:
        trainer = subprocess.Popen(
            [sys.executable, "-m", "trainer", "run", "--launch", str(tmp_path / "launch.yaml")],
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while _step(progress) < 1:  # the first step's episodes play in sandboxes that answer
            assert trainer.poll() is None, (tmp_path / "trainer.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no first step in 180 s"
            time.sleep(0.5)
        starved_from = time.monotonic()
        # The bound, the episodes' publishing interval, and one status call's own time.
        bound = STALL_AFTER_S + MIN_INTERVAL_S + 15
        entry, overall = _train_entry(experiment, storage_root)
        while not entry["verdict"].startswith("stalled"):
            assert time.monotonic() - starved_from < bound, entry
            time.sleep(1)
            entry, overall = _train_entry(experiment, storage_root)
        assert trainer.poll() is None  # lifecycle: the trainer runs
        assert entry["state"] == "running" and overall == entry["verdict"], entry
        assert "(sandbox errors " in entry["verdict"] and "command timeout" in entry["verdict"], entry
        assert entry["ladder"]["eta_s"] is None and entry["ladder"]["episodes"]["finished"] == 0, entry["ladder"]
        text = _status(experiment, storage_root)
        assert text.returncode == 0, text.stderr  # a verdict read is a command done (README's exit classes)
        assert "verdict: stalled: " in text.stdout and "    episodes   " in text.stdout, text.stdout
        assert "ETA ?" in text.stdout, text.stdout
    finally:
        os.killpg(trainer.pid, signal.SIGKILL)
        trainer.wait()
