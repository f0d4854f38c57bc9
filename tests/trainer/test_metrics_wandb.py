"""`trainer.logger: wandb` with the real wandb package, offline: no account, no network, files under WANDB_DIR."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import wandb

from rlbuild.contracts.metricstream import MetricsStream
from trainer.errors import TrainerError
from trainer.metrics import MetricsWriter, open_wandb

STEPS = {step: {"eval/accuracy": step / 4, "policy/kl": step / 100} for step in (1, 2, 3)}


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """Offline W&B that writes only under tmp_path and ignores the developer's own W&B settings and login."""
    for name in ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_ID", "WANDB_RESUME", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "config"))  # settings file (~/.config/wandb)
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "cache"))  # the service's debug logs (~/.cache/wandb)
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "data"))  # artifact staging (~/.local/share/wandb)
    yield tmp_path
    wandb.teardown()  # finish() leaves the wandb-core service running for the rest of the process


def test_wandb_offline_run_lands_under_wandb_dir_with_the_logged_history(offline_wandb):
    metrics_file = offline_wandb / "metrics.jsonl"
    run = open_wandb("rlbuild-test", "tiny-wandb-v1", "tiny-wandb", {"trainer": {"lr": 3e-4}})
    assert run.group == "tiny-wandb"  # the runs of one series share it (trainer/metrics.py)
    writer = MetricsWriter(MetricsStream(str(offline_wandb / "segments"), -1), len(STEPS), wandb_run=run)
    try:
        for step, values in STEPS.items():
            writer.log(step, values)
    finally:
        writer.close(str(metrics_file))

    assert [json.loads(line) for line in metrics_file.read_text().splitlines()] == [
        {"step": step, **values} for step, values in STEPS.items()
    ]
    runs = list((offline_wandb / "wandb").glob("offline-run-*-tiny-wandb-v1"))
    assert len(runs) == 1, sorted(p.name for p in (offline_wandb / "wandb").iterdir())
    assert (runs[0] / "run-tiny-wandb-v1.wandb").is_file()

    # `wandb leet inspect --json` prints the run file's records as JSON lines, without network or account.
    inspected = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(runs[0])],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    records = [json.loads(line) for line in inspected.stdout.splitlines() if line.startswith("{")]
    history = [r["history"]["item"] for r in records if r.get("type") == "history"]
    # W&B keeps the namespaced keys; its UI groups the panels by the part before the slash.
    assert [(h["_step"], h["eval/accuracy"], h["policy/kl"]) for h in history] == [
        (step, values["eval/accuracy"], values["policy/kl"]) for step, values in STEPS.items()
    ]


def test_unwritable_wandb_dir_fails_with_one_line_naming_it(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("WANDB_DIR", str(blocker))
    with pytest.raises(TrainerError, match=r"^WANDB_DIR=\S+ is not a writable directory; point WANDB_DIR at one"):
        open_wandb("rlbuild-test", "tiny-wandb-v1", "tiny-wandb-v1", {})
