"""The detached coordinator on a real local Iris cluster with S3 (moto): `rlbuild submit` returns at once, the
default graph (one CPU node: a one-node gang) completes inside the cluster, `rlbuild status` follows it (a
running train whose step advances, then every artifact done), and a second submission finds the first."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from rlbuild.ops.status import Options, gather
from rlbuild.plan.preflight import load_experiment
from rlbuild.schedulers.iris.localcluster import LocalIris
from tests.conftest import EXPERIMENTS, copy_of_the_code
from tests.iris.conftest import REPO, S3, fast_flags, snakemake_env, wait_for
from tests.iris.test_gang import job_state

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
VERSION = "2026.09.21"
SUBMITTED = re.compile(r"(submitted as|is already running as) Iris job (\S+)")


def detached_experiment(checkout: Path, name: str = "detached", max_steps: int = 10) -> Path:
    """An experiment file of `checkout` (untracked, not ignored: it travels in the bundle): a short train with one
    checkpoint on the way."""
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["name"] = name
    doc["recipe"]["trainer"].update({"max_steps": max_steps, "ckpt_interval": 5, "eval_interval": -1})
    path = checkout / "config" / "experiments" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def a_clone(folder: Path) -> Path:
    """A fresh clone of this working tree, as a researcher's laptop holds it (a git repository, no venv)."""
    clone = copy_of_the_code(folder)
    subprocess.run(["git", "init", "-q"], cwd=clone, check=True)
    subprocess.run(["git", "add", "-A"], cwd=clone, check=True)
    return clone


def submit(experiment: Path, env: dict[str, str], *targets: str, checkout: Path = REPO) -> tuple[str, str]:
    argv = [sys.executable, "-m", "rlbuild", "submit", *targets, "--experiment", str(experiment), "--cpu-pool", "cpu"]
    argv += ["--", *fast_flags(), "--config", f"versions=['{VERSION}']"]
    result = subprocess.run(argv, cwd=checkout, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    match = SUBMITTED.search(result.stdout)
    assert match, result.stdout
    return match.group(1), match.group(2)


def launch_requests(url: str) -> dict[str, str]:
    """Every job's original launch request as the controller keeps it (entrypoint, environment, files), as JSON."""
    jobs = _rpc(url, "ListJobs", {})["jobs"]
    return {j["jobId"]: json.dumps(_rpc(url, "GetJobStatus", {"jobId": j["jobId"]})["request"]) for j in jobs}


def _rpc(url: str, method: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{url}/iris.cluster.ControllerService/{method}", json=body, timeout=30)
    response.raise_for_status()
    return response.json()


def test_a_detached_run_from_a_deleted_clone_completes_and_status_follows_it(
    iris: LocalIris, s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = a_clone(tmp_path / "laptop" / "rlbuild")
    experiment = detached_experiment(clone)
    kept = tmp_path / "detached.yaml"  # what status, run from another checkout, reads
    shutil.copy(experiment, kept)
    env = snakemake_env(iris, tmp_path / "home", {**s3.env, "RLBUILD_BUCKET": s3.bucket, "RLBUILD_PREFIX": "p"})
    for name, value in s3.env.items():
        if name.startswith("SNAKEMAKE_STORAGE_S3_"):
            monkeypatch.setenv(name, value)
    verb, job = submit(experiment, env, checkout=clone)  # the submitting process has exited here
    assert verb == "submitted as"
    assert submit(experiment, env, checkout=clone) == ("is already running as", job)  # found, not started again
    shutil.rmtree(clone)  # the laptop's checkout is gone: the coordinator and its jobs run from their bundles
    spec, options = load_experiment(kept), Options(addresses={"iris": iris.url})

    def status() -> dict[str, Any]:
        return gather(spec, [VERSION], f"s3://{s3.bucket}/p", None, options)

    def running_train() -> dict[str, Any] | None:
        document = status()
        return document if document["versions"][VERSION]["train"]["state"] == "running" else None

    first = wait_for(running_train, 600, "a running train", poll=1)
    assert first["coordinators"][0]["job"] == job and first["coordinators"][0]["job_state"] == "running"
    ladder = first["versions"][VERSION]["train"]["ladder"]
    assert ladder["gang"]["job_state"] == "running" and ladder["gang"]["nodes_expected"] == 1
    seen = [ladder.get("last_step") or 0]  # every step status shows while the train runs, then its final one

    def train_ended() -> bool:
        train = status()["versions"][VERSION]["train"]
        if train["state"] == "running":
            seen.append(train["ladder"].get("last_step") or 0)
        return train["state"] == "done"

    # A short train may end between two polls: the step status follows is the one it shows running, then the end.
    wait_for(train_ended, 600, "the train to finish", poll=1)
    seen.append(json.loads(s3.read(f"p/detached/train/v{VERSION}/terminal.json"))["global_step"])
    assert seen == sorted(seen) and seen[0] < seen[-1] == 10, f"status saw steps {seen}"
    done = wait_for(lambda: (d := status())["verdict"] == "done" and d, 600, "every artifact done", poll=3)
    assert {kind: e["state"] for kind, e in done["versions"][VERSION].items()} == {
        kind: "done" for kind in ("base_model", "stage_model", "stage_data", "launch", "train", "export", "eval")
    }
    wait_for(lambda: status()["coordinators"][0]["job_state"] == "succeeded", 120, "the coordinator to succeed")
    requests = {j: r for j, r in launch_requests(iris.url).items() if j == job or j.startswith(f"{job}/")}
    assert any("/train-" in j for j in requests) and any("/eval-" in j for j in requests), sorted(requests)
    for submitted, request in requests.items():
        assert str(clone) not in request and str(REPO) not in request, (submitted, request[:3000])
        assert "IRIS_WORKDIR" in request, submitted  # each runs from its own bundle


def test_cancel_stops_the_coordinator_and_its_jobs(
    iris: LocalIris, iris_client, s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    experiment = detached_experiment(a_clone(tmp_path / "clone"), name="cancelled", max_steps=5000)
    env = snakemake_env(iris, tmp_path / "home", {**s3.env, "RLBUILD_BUCKET": s3.bucket, "RLBUILD_PREFIX": "p"})
    for name, value in s3.env.items():
        if name.startswith("SNAKEMAKE_STORAGE_S3_"):
            monkeypatch.setenv(name, value)
    target = f"train/v{VERSION}/terminal.json"
    _, coordinator = submit(experiment, env, target, checkout=experiment.parents[2])
    spec, options = load_experiment(experiment), Options(addresses={"iris": iris.url})

    def training_gang() -> str | None:
        train = gather(spec, [VERSION], f"s3://{s3.bucket}/p", None, options)["versions"][VERSION]["train"]
        gang = (train.get("ladder") or {}).get("gang") or {}
        return gang.get("job") if gang.get("job_state") == "running" else None

    gang = wait_for(training_gang, 600, "the coordinator's train gang to run", poll=2)
    argv = [sys.executable, "-m", "rlbuild", "cancel", target, "--experiment", str(experiment)]
    result = subprocess.run(
        argv, cwd=experiment.parents[2], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0 and f"cancelled Iris job {coordinator}" in result.stdout, result.stderr
    assert gang.startswith(f"{coordinator}/"), gang  # the gang is the coordinator's child
    for job in (coordinator, gang):
        wait_for(lambda job=job: job_state(iris_client, job) == "killed", 60, f"{job} to be killed")
