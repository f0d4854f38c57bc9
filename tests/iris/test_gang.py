"""The executor against a real local Iris cluster: gangs bring up Ray across their nodes and run the job step;
failures, Ctrl-C, restarts of Snakemake and killed tasks behave as the contract says."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlbuild.core.wire import RAY_PORT_NAMES
from rlbuild.schedulers.iris.localcluster import LocalIris
from tests.iris.conftest import (
    REPO,
    S3,
    fast_flags,
    run_snakemake,
    snakemake_env,
    start_snakemake,
    wait_for,
    workflow_copy,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]  # 153 s seen on a loaded 2-core box
SUBMITTED = re.compile(r"Submitted gang to Iris as 2-node gang (\S+)")


def job_state(client, wire: str) -> str:
    from iris.cluster.types import JobName

    return client.job_state(JobName.from_wire(wire)).value


def submitted_job(log: Path) -> str | None:
    match = SUBMITTED.search(log.read_text()) if log.exists() else None
    return match.group(1) if match else None


def task_pids(job: str, rank: int) -> list[int]:
    """PIDs of this gang task's bootstrap (read from /proc: the processes our own cluster started)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        # Any attempt: Iris numbers a task's attempts (`task:attempt`), and a start it retried before the task ran
        # (a worker that was slow to take it, under load) is a new attempt without being a failure.
        task = f"IRIS_TASK_ID={job}/{rank}:".encode()
        if b"rlbuild.schedulers.gangtask" in cmdline and any(e.startswith(task) for e in environ):
            found.append(int(proc.name))
    return found


def test_two_node_gang_runs_with_local_storage(iris: LocalIris, tmp_path: Path) -> None:
    workdir = workflow_copy(tmp_path)
    code, out = run_snakemake(
        ["--executor", "iris", "--jobs", "2", *fast_flags()], workdir, snakemake_env(iris, tmp_path / "home"), 240
    )
    assert code == 0, out
    assert (workdir / "out" / "gang.txt").read_text() == "2\n"  # the job step saw both nodes in Ray
    assert "Submitted prepare to Iris" in out


def test_profile_runs_a_gang_with_s3_storage_as_typed_from_the_repo_root(
    iris: LocalIris, s3: S3, tmp_path: Path
) -> None:
    workdir = workflow_copy(tmp_path)
    env = snakemake_env(iris, tmp_path / "home", {**s3.env, "RLBUILD_BUCKET": s3.bucket, "RLBUILD_PREFIX": "p"})
    argv = ["--profile", "iris", "--snakefile", str(workdir / "Snakefile"), "--directory", str(workdir)]
    code, out = run_snakemake([*argv, *fast_flags()], REPO, env, 240)
    assert code == 0, out
    assert s3.read("p/out/gang.txt") == "2\n"
    assert "Running prepare locally" in out  # the profile keeps small CPU rules beside Snakemake
    logs = "".join(p.read_text() for p in (workdir / ".snakemake").rglob("*.log"))
    assert s3.env["SNAKEMAKE_STORAGE_S3_SECRET_KEY"] not in out + logs


def test_impossible_gang_fails_with_a_clear_message_within_the_scheduling_timeout(
    iris: LocalIris, tmp_path: Path
) -> None:
    workdir = workflow_copy(tmp_path)
    argv = ["--executor", "iris", "--jobs", "2", *fast_flags(), "--iris-scheduling-timeout", "5"]
    started = time.monotonic()
    code, out = run_snakemake([*argv, "--config", "nodes=3"], workdir, snakemake_env(iris, tmp_path / "home"), 120)
    assert code != 0
    assert time.monotonic() - started < 90
    assert re.search(r"Iris job /\S+/gang-\S+ ended unschedulable", out), out
    assert "Scheduling timeout exceeded" in out


def test_ctrl_c_leaves_a_running_gang_running_by_default(iris: LocalIris, iris_client, tmp_path: Path) -> None:
    from iris.cluster.types import JobName

    workdir = workflow_copy(tmp_path)
    log = tmp_path / "snakemake.log"
    argv = ["--executor", "iris", "--jobs", "2", *fast_flags(), "--config", "sleep=120"]
    process = start_snakemake(argv, workdir, snakemake_env(iris, tmp_path / "home"), log)
    try:
        job = wait_for(lambda: submitted_job(log), 120, "the gang's submission")
        wait_for(lambda: job_state(iris_client, job) == "running", 60, "the gang to run")
        process.send_signal(signal.SIGINT)
        process.wait(60)
        time.sleep(3)
        assert job_state(iris_client, job) == "running"  # no work lost: the gang trains on
        assert f"Left Iris gang {job} running" in log.read_text() and f"iris job cancel {job}" in log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
        iris_client.cancel_job(JobName.from_wire(job))


def test_ctrl_c_cancels_the_iris_job_when_asked_to(iris: LocalIris, iris_client, tmp_path: Path) -> None:
    workdir = workflow_copy(tmp_path)
    log = tmp_path / "snakemake.log"
    argv = [
        "--executor",
        "iris",
        "--jobs",
        "2",
        *fast_flags(),
        "--iris-on-interrupt",
        "cancel",
        "--config",
        "sleep=120",
    ]
    process = start_snakemake(argv, workdir, snakemake_env(iris, tmp_path / "home"), log)
    try:
        job = wait_for(lambda: submitted_job(log), 120, "the gang's submission")
        wait_for(lambda: job_state(iris_client, job) == "running", 60, "the gang to run")
        process.send_signal(signal.SIGINT)
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
    wait_for(lambda: job_state(iris_client, job) == "killed", 20, f"{job} to be killed")
    assert "Cancelled Iris job" in log.read_text()


def test_restarted_snakemake_adopts_the_job_it_submitted(iris: LocalIris, iris_client, tmp_path: Path) -> None:
    workdir = workflow_copy(tmp_path)
    env = snakemake_env(iris, tmp_path / "home")
    argv = ["--executor", "iris", "--jobs", "2", *fast_flags(), "--config", "sleep=25"]
    first = start_snakemake(argv, workdir, env, tmp_path / "first.log")
    job = wait_for(lambda: submitted_job(tmp_path / "first.log"), 120, "the gang's submission")
    wait_for(lambda: job_state(iris_client, job) == "running", 60, "the gang to run")
    os.killpg(first.pid, signal.SIGKILL)  # Snakemake dies without cancelling; the gang keeps running
    first.wait()
    assert run_snakemake(["--unlock"], workdir, env, 60)[0] == 0
    code, out = run_snakemake([*argv, "--rerun-incomplete"], workdir, env, 240)
    assert code == 0, out
    assert f"Found Iris 2-node gang {job} submitted earlier" in out
    assert "Submitted gang" not in out
    assert (workdir / "out" / "gang.txt").read_text() == "2\n"


def job_logs(client, job: str) -> str:
    from iris.cluster.types import JobName

    return "\n".join(entry.data for entry in client.job(JobName.from_wire(job)).logs())


def test_snakemake_retries_of_a_gang_are_refused(iris: LocalIris, tmp_path: Path) -> None:
    """Snakemake's rule-level retries rerun inside the spawned job; gangs are retried by Iris instead."""
    (tmp_path / "Snakefile").write_text(
        "rule gang:\n    output: 'x'\n    retries: 2\n"
        "    resources: gpu_nodes=2, gpus_per_node=8, gpu_variant='H100'\n    shell: 'touch {output}'\n"
    )
    code, out = run_snakemake(["--executor", "iris", "--jobs", "1"], tmp_path, snakemake_env(iris, tmp_path / "h"), 120)
    assert code != 0
    assert "retries of rule gang=2: gangs are retried by Iris as a whole" in out


def test_a_gang_that_cannot_succeed_on_retry_is_not_retried(iris: LocalIris, iris_client, tmp_path: Path) -> None:
    """A runtime digest mismatch would fail every attempt: the task exits 3 and cancels its own job."""
    from iris.cluster.types import JobName

    from rlbuild.contracts import runtime
    from rlbuild.dev.launches import write_test_launch
    from rlbuild.schedulers.iris.client import Iris, Submission, shell
    from snakemake_executor_plugin_iris.requests import Defaults, gang_command, placement

    launch = write_test_launch(tmp_path)
    launch.write_text(launch.read_text().replace(runtime.source_digest(), "feed" * 16))
    defaults = Defaults(cpu=2, memory="4GB", disk="4GB", priority="interactive", max_retries=2, coschedule="leafgroup")
    place = placement({"gpu_nodes": 1, "gpus_per_node": 1, "gpu_variant": "cpu"}, 1, defaults)
    command = gang_command(sys.executable, 1, "g", "true", str(launch), None, 60)
    client = Iris(iris.url)
    try:
        env = {"PATH": os.environ["PATH"]}
        sub = Submission(shell(str(REPO), command), env, list(RAY_PORT_NAMES), 120, "cpu")
        job, _ = client.submit(f"mismatch-{tmp_path.name[-12:]}", place, sub)
    finally:
        client.close()
    wait_for(lambda: job_state(iris_client, job.to_wire()) == "killed", 120, "the job to be cancelled, not retried")
    assert iris_client.job_status(JobName.from_wire(job.to_wire())).failure_count == 0

    def told() -> bool:  # Iris's logs trail a job's terminal state (by seconds on a loaded host)
        text = "\n".join(e.data for e in iris_client.job(job).logs())
        return "error (not retryable)" in text and "a retry would fail the same way" in text

    wait_for(told, 30, "the task's log to say it is not retryable and cancelled its job")


def test_gang_bootstrap_benchmark_brings_up_a_gang_on_the_suites_cluster(iris: LocalIris) -> None:
    """benchmarks/gang_bootstrap.py on its smallest budget, on this folder's cluster (a second local cluster beside
    it would hand out the same task ports: their gangs' Ray ports could meet)."""
    argv = [sys.executable, "benchmarks/gang_bootstrap.py", "--sizes", "1", "--repeats", "1", "--iris-url", iris.url]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "gang start -> all alive" in result.stdout
