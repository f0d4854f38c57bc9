"""Fixtures: one real local Iris cluster (fake H100x8 workers sharing a `leafgroup`, plus a CPU pool) and one
loopback S3 server (moto) per test session; helpers to run `snakemake` against them as a user would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlbuild.schedulers.iris.localcluster import REPO, LocalIris
from tests.conftest import S3, foreground_job

WORKFLOW = Path(__file__).parent / "workflow"
GPU_WORKERS = 2


@pytest.fixture(scope="session")
def iris(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalIris]:
    with LocalIris(tmp_path_factory.mktemp("iris"), workers=GPU_WORKERS, cpu_workers=1) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def iris_client(iris: LocalIris):
    from iris.client import IrisClient

    client = IrisClient.remote(iris.url)
    yield client
    client.shutdown()


def snakemake_env(iris: LocalIris, home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "SNAKEMAKE_IRIS_CONTROLLER_URL": iris.url,
        "RAY_USAGE_STATS_ENABLED": "0",
        **(extra or {}),
    }


def fast_flags(*, cpu_pool: bool = True) -> list[str]:
    # A gang's join waits 600 s, not the default 1800: a gang restarted after a killed node once took more than 120 s
    # on a loaded 2-core box (rank 1's `ray start` missed Ray's 30 s raylet registration once, and was started again).
    flags = ["--seconds-between-status-checks", "1", "--iris-status-interval", "1", "--iris-join-timeout", "600"]
    return [*flags, "--iris-cpu-pool", "cpu"] if cpu_pool else flags


def workflow_copy(tmp_path: Path) -> Path:
    workdir = tmp_path / "wf"
    workdir.mkdir()
    (workdir / "Snakefile").write_text((WORKFLOW / "Snakefile").read_text())
    return workdir


def start_snakemake(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`snakemake ...` as a terminal's foreground job (so a test can Ctrl-C it)."""
    return foreground_job([str(Path(sys.executable).parent / "snakemake"), *argv], cwd=cwd, env=env, log=log)


def run_snakemake(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int, str]:
    log = Path(env["HOME"]) / f"snakemake-{uuid.uuid4().hex[:6]}.log"
    process = start_snakemake(argv, cwd, env, log)
    try:
        code = process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)
        process.wait(30)
        raise
    return code, log.read_text()


def wait_for(predicate, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


__all__ = ["REPO", "S3", "fast_flags", "run_snakemake", "snakemake_env", "start_snakemake", "wait_for", "workflow_copy"]
