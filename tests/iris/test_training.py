"""The project's graph through `snakemake --profile iris` on a real local Iris cluster with S3 (moto): the
`train` rule runs the tiny GRPO trainer as a 2-node gang; killing one node (its task's whole process group) once
the gang's Ray has assembled and trained to a checkpoint makes Iris restart the whole gang, and training resumes
from the latest checkpoint and finishes with the same step count. This is the suite's one run of a killed gang
task: the stand-in gang of tests/iris/test_gang.py is not killed again."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest
import yaml

from rlbuild.contracts.launch import parse_launch
from rlbuild.schedulers.iris.localcluster import LocalIris
from tests.conftest import EXPERIMENTS, copy_of_the_code
from tests.iris.conftest import REPO, S3, fast_flags, snakemake_env, start_snakemake, wait_for
from tests.iris.test_gang import job_logs, task_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # 590 s seen on a loaded 2-core box
VERSION = "2026.09.21"
MAX_STEPS = 8  # the kill lands after the first checkpoint (step 2): steps enough to see the resume running
NAME = "iris-gang"
SUBMITTED = re.compile(r"Submitted train to Iris as 2-node gang (\S+)")


def two_node_experiment(folder: Path) -> Path:
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["name"] = NAME
    doc["topology"] = {"num_nodes": 2, "gpus_per_node": 1, "gpu_variant": "H100"}
    doc["role_plan"].update({"policy_num_nodes": 2, "policy_num_gpus_per_node": 1, "num_inference_engines": 2})
    doc["recipe"]["trainer"].update(
        {"max_steps": MAX_STEPS, "ckpt_interval": 2, "eval_interval": -1, "eval_before_train": False}
    )
    doc["execution"]["iris"].update({"max_retries": 1})
    doc["recipe"]["generator"] = {"backend": "torch"}  # CPU stand-ins for the H100s: no vLLM here
    # Every node checks that Iris handed its task the experiment's env (rlbuild/job/gang.py check_runtime).
    doc["execution"]["env"] = {"NCCL_P2P_DISABLE": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
    path = folder / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_two_node_training_survives_a_killed_node_and_resumes(
    iris: LocalIris,
    iris_client,
    s3: S3,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from iris.cluster.types import JobName

    # The experiment is a file of the checkout the jobs' bundles carry (a copy of this one, so the test writes
    # nothing into the repository).
    checkout = copy_of_the_code(tmp_path / "checkout")
    experiment = two_node_experiment(checkout / "config" / "experiments")
    workdir = tmp_path / "run"
    workdir.mkdir()
    env = snakemake_env(iris, tmp_path / "home", {**s3.env, "RLBUILD_BUCKET": s3.bucket, "RLBUILD_PREFIX": "p"})
    argv = ["--profile", str(REPO / "profiles" / "iris"), "--snakefile", str(checkout / "Snakefile")]
    argv += ["--directory", str(workdir)]
    argv += [*fast_flags(cpu_pool=False), "--config", f"experiment={experiment}", f"versions=['{VERSION}']"]
    log = tmp_path / "snakemake.log"
    process = start_snakemake([f"export/v{VERSION}", *argv], REPO, env, log)
    prefix = f"p/{NAME}"
    latest = f"{prefix}/tmp/ttl=14d/train/v{VERSION}/checkpoints/latest"
    try:
        job = wait_for(lambda: (m := SUBMITTED.search(log.read_text())) and m.group(1), 300, "the train gang")
        wait_for(lambda: _read(s3, latest), 400, "the first checkpoint", poll=0.5)
        assert "Ray nodes alive: 2/2" in job_logs(iris_client, job)  # the gang's Ray spans both nodes
        pids = task_pids(job, 1)
        assert pids, f"rank 1's bootstrap is not running; the gang's log ends:\n{job_logs(iris_client, job)[-3000:]}"
        os.killpg(os.getpgid(pids[0]), signal.SIGKILL)  # a node is lost mid-training, as its whole process group
        # Iris fails the gang, stops its other task and starts both again: over 300 s on a loaded 2-core box, and a
        # restarted node's `ray start` may itself fail once there and be started again (rlbuild/job/gang.py).
        resumed = wait_for(lambda: resumed_in_status(experiment, s3, iris, monkeypatch), 900, "status to show it")
        assert resumed["state"] == "running" and resumed["ladder"]["gang"]["attempt"] >= 1, resumed
        assert process.wait(600) == 0, log.read_text()[-5000:]
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.wait(60)
    # Worker nodes materialise every input the stored launch document names: no URI may be redacted away.
    stored = parse_launch(yaml.safe_load(s3.read(f"{prefix}/launch/v{VERSION}/launch.yaml")), "stored launch")
    assert stored.inputs.model.uri == f"s3://{s3.bucket}/{prefix}/stage/model/v{VERSION}"
    terminal = json.loads(s3.read(f"{prefix}/train/v{VERSION}/terminal.json"))
    assert terminal["global_step"] == MAX_STEPS
    assert s3.read(f"{prefix}/export/v{VERSION}.identity.json")
    status = iris_client.job_status(JobName.from_wire(job))
    assert status.failure_count == 1
    logs = job_logs(iris_client, job)
    assert logs.count("Ray nodes alive: 2/2") >= 2, logs[-3000:]  # the whole gang restarted, not only rank 1
    assert re.search(r"\[trainer\] resumed from \S+ at step [1-9]", logs), logs[-3000:]


def resumed_in_status(experiment: Path, s3: S3, iris: LocalIris, monkeypatch: pytest.MonkeyPatch) -> dict | None:
    """The train entry of `rlbuild status` once it shows the restart and "resumed from step N", before the end."""
    from rlbuild.ops.status import Options, gather
    from rlbuild.ops.statusview import format_status
    from rlbuild.plan.preflight import load_experiment

    for name, value in s3.env.items():
        if name.startswith("SNAKEMAKE_STORAGE_S3_"):
            monkeypatch.setenv(name, value)
    document = gather(
        load_experiment(experiment), [VERSION], f"s3://{s3.bucket}/p", None, Options(addresses={"iris": iris.url})
    )
    train = document["versions"][VERSION]["train"]
    ladder = train.get("ladder") or {}
    if train["state"] == "done":
        raise AssertionError("training finished before status showed the resume")
    if ladder.get("trainer_starts", 0) >= 2 and (ladder.get("resumed_from") or 0) >= 1:
        text = format_status(document)
        assert f"resumed    from step {ladder['resumed_from']}" in text and "restarts   1" in text, text
        return train
    return None


def _read(s3: S3, key: str) -> str | None:
    try:
        return s3.read(key)
    except Exception:  # not written yet
        return None
