"""A new user's first hour, as the README has it, typed in a fresh copy of the code with the set-up's environment
on PATH: the quickstart (`make main`), interrupted during training with Ctrl-C and run again, which resumes; `rlbuild
status` between the two; a partial rebuild (`snakemake --forcerun eval`); then the shipped series
(`snakemake --cores 2 --config experiment=tiny-series`: four arms, a KL change, a seed change, a smoke, and a fifth
identical to base) and its comparison (`rlbuild compare tiny-series --version 2026.09.21`). The user's one edit:
small budgets in the copy's experiment files. Then what a team does next with the series (a dry run with each arm's
cost, status, a new arm, an edited arm). One run, many assertions.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlbuild.stages.basemodel import CACHE_ENV
from tests.conftest import EXPERIMENTS, REPO, copy_of_the_code, foreground_job
from tests.e2e.test_interrupts import latest_checkpoint, train_logs
from tests.e2e.test_pipeline import VERSION, Pipeline, ran
from tests.faults import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SHIPPED = yaml.safe_load((EXPERIMENTS / "tiny-series.yaml").read_text())
# The shipped series on a budget: the smoke 1 step, the others 2, and a fifth arm identical to base (no job).
ARMS: dict[str, Any] = copy.deepcopy(SHIPPED["arms"]) | {"base-again": {}}
ARMS["smoke"]["recipe"]["trainer"] |= {"max_steps": 1, "eval_interval": 1}
BUILT = ("smoke", "base", "kl-low", "seed-7")


def series_experiment(folder: Path, arms: dict[str, Any]) -> Path:
    doc = copy.deepcopy(SHIPPED)
    doc["recipe"]["trainer"].update({"max_steps": 2, "ckpt_interval": 2, "eval_interval": 2})
    doc["arms"] = arms
    path = folder / "tiny-series.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def key(arm: str) -> str:
    return f"{VERSION}@{arm}"


def rlbuild(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rlbuild", *argv], cwd=REPO, capture_output=True, text=True, timeout=120, check=False
    )


def train_order(log: str) -> tuple[dict[str, int], dict[str, int]]:
    """Where in Snakemake's log each arm's train job started and finished (line numbers)."""
    lines = log.splitlines()
    started: dict[str, int] = {}
    jobs: dict[str, str] = {}
    for i, line in enumerate(lines):
        if line.strip() in ("rule train:", "localrule train:"):
            block = lines[i : i + 15]
            jobid = next(b.split(":")[1].strip() for b in block if b.strip().startswith("jobid:"))
            arm = next(b.split("@")[1].strip() for b in block if b.strip().startswith("wildcards: version="))
            started[arm], jobs[jobid] = i, arm
    finished = {
        jobs[m[1]]: i for i, line in enumerate(lines) if (m := re.match(r"Finished jobid: (\d+) \(Rule: train\)", line))
    }
    return started, finished


QUICKSTART_STEPS = 12  # room to interrupt once step 2 is checkpointed, and still train after the resume
COMPARE = f"rlbuild compare tiny-series --version {VERSION}"


@dataclass(frozen=True)
class FirstHour:
    copy: Path
    said: dict[str, subprocess.CompletedProcess[str]]  # what each command printed, by the command as typed
    series: Pipeline  # the series' experiment file and storage in the copy, for the team's next steps
    series_log: str  # Snakemake's log of the series run, in order


def typed(command: str, copy: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", command], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def ctrl_c_in_training(command: str, copy: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`command` as a terminal's foreground job, and Ctrl-C (SIGINT to its whole process group) once its training
    has checkpointed step 2."""
    log = copy / "interrupted.log"
    process = foreground_job(["bash", "-c", command], cwd=copy, env=env, log=log)
    root = copy / "results" / "tiny-addition"
    wait_until(lambda: latest_checkpoint(root) >= 2 or process.poll() is not None, 600, 0.1)
    assert process.poll() is None, f"{command} ended before the interrupt: {log.read_text()[-3000:]}"
    os.killpg(process.pid, signal.SIGINT)
    code = process.wait(timeout=300)
    return subprocess.CompletedProcess(command, code, log.read_text(), "")


@pytest.fixture(scope="module")
def first_hour(tmp_path_factory: pytest.TempPathFactory) -> FirstHour:
    copy = copy_of_the_code(tmp_path_factory.mktemp("first-hour") / "rlbuild")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLBUILD_", "SNAKEMAKE_"))}
    # `source .venv/bin/activate`, and the session's base-model cache (each model built once per test run).
    env |= {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", "PYTHONPATH": str(copy)}
    env[CACHE_ENV] = os.environ[CACHE_ENV]
    quickstart = copy / "config" / "experiments" / "tiny-addition.yaml"
    doc = yaml.safe_load(quickstart.read_text())
    doc["recipe"]["trainer"] |= {"max_steps": QUICKSTART_STEPS, "ckpt_interval": 2}
    quickstart.write_text(yaml.safe_dump(doc, sort_keys=False))
    # `make main` as typed, without its set-up step (`-o setup`): the environment on PATH is the one it makes.
    said = {"make main, Ctrl-C": ctrl_c_in_training("make -o setup main", copy, env)}
    for command in ("rlbuild status", "make -o setup main", "snakemake --forcerun eval"):
        said[command] = typed(command, copy, env)
    series = Pipeline(copy, series_experiment(copy / "config" / "experiments", ARMS))
    plan = series.run("-n")
    assert ran(plan) == {
        "base_model": 1,  # staged once for every arm
        "stage_model": 1,
        "stage_data": 1,
        "resolve_launch": 4,  # base-again adds no job
        "train": 4,
        "export": 4,
        "eval": 4,
        "compare": 1,
        "all": 1,
    }
    text = plan.stdout + plan.stderr
    assert "the same build, no job of its own: base-again = base" in text
    assert "kl-low: changes recipe.trainer.algorithm.kl_loss_coef 0.04 -> 0.001" in text  # the default, as a value
    # Without the smoke's gate a single arm's training is one train job; with it, the smoke's comes first.
    gated = ran(series.run("-n", targets=(f"train/v{key('base')}/terminal.json",)))
    free = ran(series.run("-n", targets=(f"train/v{key('base')}/terminal.json",), config=("skip_smoke=true",)))
    assert gated["train"] == 2 and free["train"] == 1
    built = typed("snakemake --cores 2 --config experiment=tiny-series", copy, env, timeout=900)
    counts = ran(built)
    assert counts["train"] == 4 and counts["stage_data"] == 1 and counts["compare"] == 1
    said[COMPARE] = typed(COMPARE, copy, env)
    return FirstHour(copy, said, series, built.stderr)


@pytest.fixture(scope="module")
def built(first_hour: FirstHour) -> tuple[Pipeline, str]:
    return first_hour.series, first_hour.series_log


def test_an_interrupted_quickstart_says_where_it_stopped_and_its_rerun_resumes_and_shows_the_result(
    first_hour: FirstHour,
) -> None:
    stopped = first_hour.said["make main, Ctrl-C"]
    said = stopped.stdout
    assert stopped.returncode == -signal.SIGINT, said[-3000:]  # make, like the run, ends by the interrupt (130)
    for crash in ("Error in rule", "RuleException", "CalledProcessError", "WorkflowError", "Traceback", "Error 130"):
        assert crash not in said, f"{crash!r} in {said[-3000:]}"
    ours = next(line for line in said.splitlines() if line.startswith("rlbuild: interrupted (SIGINT): stopped "))
    step = int(re.search(r"train/v\S+ at step (\d+)", ours)[1])  # type: ignore[index]
    assert 2 <= step < QUICKSTART_STEPS and "run the same command again: snakemake --cores 2" in ours, ours
    assert said.rstrip().endswith("] Interrupt"), said[-500:]  # make's own word for it, after ours
    status = first_hour.said["rlbuild status"]
    assert status.returncode == 0 and f"interrupted at step {step}, resumable" in status.stdout, status.stdout
    assert "ETA" not in status.stdout.split(f"interrupted at step {step}")[1].splitlines()[0]
    again = first_hour.said["make -o setup main"]
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    root = first_hour.copy / "results" / "tiny-addition"
    assert (
        f"resumed from {root}/tmp/ttl=14d/train/v{VERSION}/checkpoints/global_step_{step} at step"
        in (train_logs(root)[-1])
    )
    terminal = json.loads((root / "train" / f"v{VERSION}" / "terminal.json").read_text())
    assert terminal["global_step"] == QUICKSTART_STEPS
    # It ends with the result and where everything is (README, "Quickstart").
    last = [line for line in (again.stdout + again.stderr).splitlines() if line.startswith("rlbuild:")][-3:]
    assert re.fullmatch(
        rf"rlbuild: tiny-addition v{VERSION}: held-out greedy accuracy \d\.\d{{3}} before training -> \d\.\d{{3}} "
        r"after, on \d+ validation prompts \(pass@\d+ \d\.\d{3}\)",
        last[0],
    ), last
    assert last[1].split()[1:3] == ["eval", str(root / "eval" / f"v{VERSION}" / "results.json")], last
    assert last[2].split()[1:] == ["report", str(root / "report.html")] and (root / "report.html").is_file(), last


def test_a_partial_rebuild_reruns_eval_only(first_hour: FirstHour) -> None:
    assert ran(first_hour.said["snakemake --forcerun eval"]) == {"eval": 1, "all": 1}


def test_the_smoke_trains_first_and_every_arm_is_exported_and_evaluated(built: tuple[Pipeline, str]) -> None:
    pipe, log = built
    started, finished = train_order(log)
    assert set(started) == set(BUILT)
    assert all(finished["smoke"] < started[arm] for arm in BUILT if arm != "smoke"), (started, finished)
    root = pipe.root
    for arm in BUILT:
        results = json.loads((root / "eval" / f"v{key(arm)}" / "results.json").read_text())
        assert 0.0 <= results["accuracy"] <= 1.0
        assert (root / "export" / f"v{key(arm)}" / "model" / "model.safetensors").is_file()
        launch = yaml.safe_load((root / "launch" / f"v{key(arm)}" / "launch.yaml").read_text())
        assert launch["inputs"]["model"]["uri"] == str(root / "stage" / "model" / f"v{VERSION}")
    assert not list(root.glob("*/v*@base-again*")) and not list(root.glob("stage/*/v*@*"))
    seeds = {arm: json.loads((root / "eval" / f"v{key(arm)}" / "results.json").read_text())["seed"] for arm in BUILT}
    assert seeds["seed-7"] == 7 and seeds["base"] == 42
    ids = {yaml.safe_load((root / "launch" / f"v{key(a)}" / "launch.yaml").read_text())["run"]["id"] for a in BUILT}
    assert len(ids) == len(BUILT)  # one W&B run per arm


def test_the_series_report_shows_every_arm(first_hour: FirstHour) -> None:
    pipe = first_hour.series
    folder = pipe.root / "series" / f"v{VERSION}"
    report = json.loads((folder / "compare.json").read_text())
    assert list(report["arms"]) == list(BUILT) and report["base"] == "base"
    assert report["aliases"] == {"base-again": "base"}
    kl = report["arms"]["kl-low"]
    assert kl["changes"] == {"recipe.trainer.algorithm.kl_loss_coef": [0.04, 0.001]}
    assert kl["delta_vs_base"]["accuracy"] == pytest.approx(
        kl["scores"]["accuracy"] - report["arms"]["base"]["scores"]["accuracy"]
    )
    assert report["arms"]["smoke"]["steps"] == 1 and report["arms"]["base"]["steps"] == 2
    assert all(arm["gpu_hours"] > 0 and arm["wall_s"] > 0 for arm in report["arms"].values())
    page = (folder / "compare.html").read_text()
    assert all(f"<td>{arm}" in page for arm in BUILT) and "data:image/png;base64," in page
    assert (folder / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # `rlbuild compare`, as typed, makes the same report from storage, in a folder of the working directory.
    made = first_hour.said[COMPARE]
    assert made.returncode == 0, made.stderr[-2000:]
    out = first_hour.copy / f"series-tiny-series-v{VERSION}"
    assert json.loads((out / "compare.json").read_text()) == report
    # Every delta against the base arm says, in words, whether the eval's prompts can tell it from noise.
    lines = {words[0]: line for line in made.stdout.splitlines() if (words := line.split()) and words[0] in BUILT}
    for arm in BUILT:
        found = report["arms"][arm]
        if arm == "base":
            assert "vs base" not in lines[arm] and "within_noise" not in found
            continue
        words = "within the eval's sampling noise" if found["within_noise"] else "beyond the eval's sampling noise"
        low, high = found["accuracy_delta_95"]
        assert low <= found["delta_vs_base"]["accuracy"] <= high and found["prompts"] == kl["prompts"] > 0
        assert f"{found['delta_vs_base']['accuracy']:+.3f} vs base, {words} (95% interval" in lines[arm], lines[arm]
    assert "within noise" in page or "beyond noise" in page


def test_the_dry_run_of_the_built_series_costs_each_arm_from_its_measured_run(built: tuple[Pipeline, str]) -> None:
    pipe, _ = built
    dry = pipe.run("-n")
    assert ran(dry) == {}
    for arm in BUILT:
        assert f"measured by train/v{key(arm)})" in dry.stderr, dry.stderr[-3000:]
    check = rlbuild("check", str(pipe.experiment), "--storage-root", str(pipe.storage), "--json")
    assert check.returncode == 0, check.stderr[-2000:]
    plans = json.loads(check.stdout)["plans"]
    assert list(plans) == [key(arm) for arm in BUILT]
    for arm in BUILT:
        cost = plans[key(arm)]["cost"]
        metrics = pipe.root / "train" / f"v{key(arm)}" / "metrics.jsonl"
        lines = [json.loads(line) for line in metrics.read_text().splitlines()]
        took = max(line["perf/elapsed_s"] for line in lines if "perf/elapsed_s" in line)
        assert cost["gpus"] == 1 and cost["gpu_hours"] == pytest.approx(took / 3600, rel=0.25), (arm, cost, took)
    status = rlbuild("status", "--experiment", str(pipe.experiment), "--storage-root", str(pipe.storage), "--json")
    assert status.returncode == 0, status.stderr[-2000:]
    versions = json.loads(status.stdout)["versions"]
    assert list(versions) == [key(arm) for arm in BUILT]
    assert all(versions[key(arm)]["train"]["state"] == "done" for arm in BUILT)
    assert all(versions[key(arm)]["train"]["gpu_hours"] > 0 for arm in BUILT)
    assert versions[key("base")]["stage_data"]["uri"].endswith(f"stage/data/v{VERSION}")


def test_a_new_arm_builds_alone_and_an_edited_arm_is_refused(built: tuple[Pipeline, str]) -> None:
    pipe, _ = built
    grown = copy.deepcopy(ARMS) | {"lr-high": {"recipe": {"trainer": {"policy": {"optimizer_config": {"lr": 2e-3}}}}}}
    series_experiment(pipe.experiment.parent, grown)
    counts = ran(pipe.run("-n"))
    assert counts == {"resolve_launch": 1, "train": 1, "export": 1, "eval": 1, "compare": 1, "all": 1}
    edited = copy.deepcopy(ARMS)
    edited["kl-low"]["recipe"]["trainer"]["algorithm"]["kl_loss_coef"] = 0.002
    series_experiment(pipe.experiment.parent, edited)
    refused = pipe.run("-n")
    assert refused.returncode != 0
    assert "kl_loss_coef" in refused.stderr and key("kl-low") in refused.stderr
    assert "Nothing to be done" not in refused.stdout
    series_experiment(pipe.experiment.parent, ARMS)


def test_a_smoke_that_changes_the_layout_is_refused_before_anything_runs(tmp_path: Path) -> None:
    arms = {"base": {}, "smoke": {"smoke": True, "topology": {"num_nodes": 2}, "role_plan": {"policy_num_nodes": 2}}}
    pipe = Pipeline(tmp_path, series_experiment(tmp_path, arms))
    refused = pipe.run()
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert (
        "arms.smoke.topology.num_nodes" in refused.stderr and "arms.smoke.role_plan.policy_num_nodes" in refused.stderr
    )
    assert not pipe.storage.exists() or not any(pipe.storage.rglob("*.identity.json"))
