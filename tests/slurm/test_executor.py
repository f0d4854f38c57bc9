"""The official Slurm plugin and rlbuild's preflight against a real local cluster. An impossible request fails
clearly and at once: refused by preflight (sinfo) before anything is submitted, and by sbatch when preflight is not
in the way; Ctrl-C cancels the Slurm jobs (the documented choice: nothing keeps running). rlbuild's own Slurm
module (rlbuild/schedulers/slurm/) reads a job's state as status does and cancels it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlbuild.ops.status import Options, scheduler_state
from rlbuild.schedulers.base import JobState, Phase
from rlbuild.schedulers.registry import scheduler_for
from tests.iris.conftest import start_snakemake, wait_for
from tests.slurm.conftest import fast_flags, snakemake_env, workflow_copy
from tests.slurm.local_cluster import LocalSlurm
from tests.spine.experiments import experiment, write

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
SUBMITTED = re.compile(r"submitted with SLURM jobid (\d+)")


def run(argv: list[str], workdir: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    log = workdir / "snakemake.log"
    process = start_snakemake(argv, workdir, env, log)
    try:
        return process.wait(timeout), log.read_text()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.wait(30)


def test_more_nodes_than_the_cluster_has_fail_at_submission(slurm: LocalSlurm, tmp_path: Path) -> None:
    workdir = workflow_copy(tmp_path)
    started = time.monotonic()
    argv = ["--executor", "slurm", "--jobs", "1", *fast_flags(), "--config", "nodes=3"]
    code, out = run(argv, workdir, snakemake_env(slurm, tmp_path / "home"), 120)
    assert code != 0
    assert time.monotonic() - started < 60
    assert "SLURM sbatch failed" in out and "Node count specification invalid" in out, out


def test_ctrl_c_cancels_the_slurm_job(slurm: LocalSlurm, tmp_path: Path) -> None:
    workdir = workflow_copy(tmp_path)
    log = workdir / "snakemake.log"
    argv = ["--executor", "slurm", "--jobs", "1", *fast_flags(), "--config", "sleep=120"]
    process = start_snakemake(argv, workdir, snakemake_env(slurm, tmp_path / "home"), log)
    try:
        job = wait_for(lambda: (m := SUBMITTED.search(log.read_text())) and m.group(1), 120, "the submission")
        wait_for(lambda: slurm.jobs().get(job) == "RUNNING", 60, f"job {job} to run")
        process.send_signal(signal.SIGINT)
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
    wait_for(lambda: slurm.jobs().get(job) == "CANCELLED", 30, f"job {job} to be cancelled")
    assert not (workdir / "out" / "done.txt").exists()


def test_preflight_asks_sinfo_and_refuses_what_the_partition_cannot_hold(slurm: LocalSlurm, tmp_path: Path) -> None:
    """Seed 004's rule against the real partition (one GPU per node, two nodes), before anything is submitted."""
    doc = experiment(
        topology={"num_nodes": 3, "gpus_per_node": 8, "gpu_variant": "H100"},
        execution__iris=None,
        execution__slurm={"account": "rlbuild", "partition": "gpu", "time_limit": "01:00:00"},
    )
    path = write(tmp_path, doc)
    env = {**os.environ, **slurm.env}
    result = subprocess.run(
        [sys.executable, "-m", "rlbuild", "check", str(path), "--json"], env=env, capture_output=True, text=True
    )
    assert result.returncode == 2, result.stderr
    errors = json.loads(result.stdout)["errors"]  # a field may carry several errors (the role plan's too)

    def error_on(field: str, text: str) -> dict:
        found = [e for e in errors if e["field"] == field and text in e["message"]]
        assert found, errors
        return found[0]

    error_on("topology.num_nodes", "3 nodes, but partition 'gpu' has 2")
    per_node = error_on("topology.gpus_per_node", "partition 'gpu' has 1 GPUs per node")
    assert per_node["fix"].startswith("set gpus_per_node: 1 and num_nodes: 24")


def test_status_reads_a_slurm_jobs_state_and_the_scheduler_cancels_it(
    slurm: LocalSlurm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in slurm.env.items():
        monkeypatch.setenv(name, value)
    argv = ["sbatch", "--parsable", "--partition", "cpu", f"--chdir={tmp_path}", "--wrap", "sleep 120"]
    submitted = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    job = f"slurm-{submitted.split(';')[0]}"  # as the gang records it in head.json
    wait_for(lambda: scheduler_state("slurm", job, Options())["job_phase"] == "running", 60, f"{job} to run")
    assert scheduler_state("slurm", job, Options()) == {
        "job_state": "running",
        "job_phase": "running",
        "job_state_note": None,
    }
    scheduler = scheduler_for("slurm")
    scheduler.cancel(job)
    wait_for(lambda: scheduler.job_states([job])[job] == JobState(Phase.FAILED, "cancelled"), 30, f"{job} to end")
