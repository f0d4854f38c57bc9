"""`rlbuild check` and the dry run run the same checks (rlbuild/plan/versioning.py): an experiment whose only
problem is one of the last checks made, the Slurm chain against the step time an earlier run measured, is refused
by both, with the same field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlbuild.cli import main
from rlbuild.core import storage
from rlbuild.plan.preflight import load_experiment
from rlbuild.plan.resolve import resolve
from tests.conftest import EXPERIMENTS, run_snakemake

VERSION = "2026.09.21"


def slow_earlier_run(tmp_path: Path) -> tuple[Path, Path]:
    """(experiment, storage root): the default experiment on Slurm without a configured step time, and the
    metrics of an earlier attempt of the version measuring 60 s per step (500 steps do not fit 3 links)."""
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    del doc["execution"]["slurm"]["step_time_s"]
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(doc))
    root = tmp_path / "results"
    artifacts = resolve(load_experiment(path), VERSION, str(root)).launch.artifacts
    lines = [{"step": step, "perf/step_time_s": 60.0} for step in (1, 2, 3)]
    storage.write_text(artifacts.metrics_uri, "".join(json.dumps(line) + "\n" for line in lines))
    return path, root


def test_check_and_the_dry_run_both_refuse_a_chain_the_measured_step_time_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, root = slow_earlier_run(tmp_path)
    code = main(["check", str(path), "--version", VERSION, "--storage-root", str(root), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 2 and report["ok"] is False
    fields = {error["field"] for error in report["errors"]}
    assert "execution.slurm.max_links" in fields, report["errors"]
    assert fields <= {"execution.slurm.max_links", "execution.slurm.time_limit"}, report["errors"]

    dry = run_snakemake(
        ["-n", f"export/v{VERSION}", "--config", f"experiment={path}", f"storage_root={root}"], cwd=tmp_path
    )
    assert dry.returncode == 2, dry.stderr[-3000:]
    assert "step time measured in an earlier run" in dry.stderr
    assert "execution.slurm.max_links" in dry.stderr
    assert "Job stats" not in dry.stdout + dry.stderr


def test_check_and_the_dry_run_both_name_a_path_problem_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A `local:` model folder holding a link to nothing (as /etc may), and an experiment path that is a symlink
    loop: one line each, from `rlbuild check` and from `snakemake -n` alike, never a traceback."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "weights.safetensors").symlink_to(tmp_path / "gone")
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["model"] = {
        "source": f"local:{model}",
        "revision": "r1",
        "tokenizer": {"source": f"local:{model}", "revision": "r1"},
    }
    path = tmp_path / "local.yaml"
    path.write_text(yaml.safe_dump(doc))
    loop = tmp_path / "loop.yaml"
    loop.symlink_to(loop)
    line = f"in {model}, weights.safetensors is a link to {tmp_path / 'gone'}, which does not exist"
    for experiment, expected in ((path, line), (loop, f"{loop} is a symlink loop")):
        code = main(["check", str(experiment), "--version", VERSION, "--storage-root", str(tmp_path / "s"), "--json"])
        errors = json.loads(capsys.readouterr().out)["errors"]
        assert code == 2 and errors and all(expected in e["message"] for e in errors), errors
        config = ["--config", f"experiment={experiment}", f"storage_root={tmp_path / 's'}"]
        dry = run_snakemake(["-n", f"stage/model/v{VERSION}", *config], cwd=tmp_path)
        assert dry.returncode == 2 and expected in dry.stderr, dry.stderr[-3000:]
        assert "Traceback" not in dry.stderr
