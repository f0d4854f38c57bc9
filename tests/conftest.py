"""Shared fixtures: a real S3-compatible server on loopback (moto, rlbuild/dev/s3.py) and a Snakemake runner."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rlbuild.dev.launches import base_model_dir
from rlbuild.dev.s3 import S3Server
from rlbuild.dev.s3 import s3_server as loopback_s3_server
from rlbuild.stages.basemodel import CACHE_ENV

REPO = Path(__file__).resolve().parent.parent
EXPERIMENTS = REPO / "config" / "experiments"
# Base models to build as the session starts (`<variant>:<seed>,...`), set by `make test`.
PREBUILD_ENV = "RLBUILD_TEST_PREBUILD"


@pytest.fixture(scope="session", autouse=True)
def base_model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One base-model cache for the test run (rlbuild/stages/basemodel.py): every graph a test runs, here or in a
    job it starts, in any worker, takes the one build of each (source, seed) instead of warm-starting its own."""
    # Under pytest-xdist every worker has a temp folder of its own; the run's folder above them is shared.
    run = tmp_path_factory.getbasetemp()
    folder = (run.parent if os.environ.get("PYTEST_XDIST_WORKER") else run) / "base-models"
    folder.mkdir(exist_ok=True)
    previous = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = str(folder)
    prebuild = _prebuild(os.environ.get(PREBUILD_ENV, ""))
    yield folder
    if prebuild is not None:
        prebuild.join()
    if previous is None:
        os.environ.pop(CACHE_ENV, None)
    else:
        os.environ[CACHE_ENV] = previous


def _prebuild(wanted: str) -> threading.Thread | None:
    """`make test` names the base models several modules wait on (`<variant>:<seed>`): the first worker starts
    building them at once, in the background, so no worker later sits idle on the build lock while one builds."""
    if not wanted or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return None
    models = [(variant, int(seed)) for variant, _, seed in (item.partition(":") for item in wanted.split(","))]
    thread = threading.Thread(
        target=lambda: [base_model_dir(seed, variant) for variant, seed in models], name="prebuild", daemon=True
    )
    thread.start()
    return thread


# The variables that steer rlbuild, its storage and its process groups (libraries set others of their own on a
# first import, torch's TORCHINDUCTOR_CACHE_DIR among them); Snakemake's S3 plugin sets two on its import.
STEERING = ("RLBUILD_", "SNAKEMAKE_", "AWS_", "GLOO_", "MASTER_", "HF_", "CUDA_")
SET_ON_IMPORT = frozenset({"AWS_REQUEST_CHECKSUM_CALCULATION", "AWS_RESPONSE_CHECKSUM_VALIDATION"})


def _steering() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(STEERING) and k not in SET_ON_IMPORT}


@pytest.fixture(autouse=True)
def environment_left_as_found() -> Iterator[None]:
    """A test leaves its worker's steering variables as it found them (monkeypatch's changes are undone before
    this looks): one left behind reaches every later test of the worker, and a storage wait of 3 s left by an
    in-process `rlbuild status` once failed an unrelated upload on a loaded machine."""
    before = _steering()
    yield
    after = _steering()
    if after == before:
        return
    changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
    for name in changed:
        if name in before:
            os.environ[name] = before[name]
        else:
            os.environ.pop(name)
    pytest.fail(f"the test left environment variables changed: {', '.join(changed)}", pytrace=False)


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    with loopback_s3_server() as server:
        yield server


@pytest.fixture
def s3_root(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on the loopback S3 server, reached by rlbuild code through SNAKEMAKE_STORAGE_S3_*."""
    for name, value in s3_server.env().items():
        if name.startswith("SNAKEMAKE_STORAGE_S3_"):
            monkeypatch.setenv(name, value)
    monkeypatch.setenv("SNAKEMAKE_STORAGE_S3_REGION", "us-east-1")
    for name in ("AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return f"s3://{s3_server.new_bucket()}"


@dataclass(frozen=True)
class S3:
    server: S3Server
    bucket: str

    @property
    def env(self) -> dict[str, str]:
        return self.server.env()

    def read(self, key: str) -> str:
        client: Any = self.server.client()
        return client.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()


@pytest.fixture
def s3(s3_server: S3Server) -> S3:
    return S3(s3_server, s3_server.new_bucket())


def run_snakemake(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    snakefile: Path | None = None,
    launcher: list[str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run the real `snakemake` CLI of this venv against the repository's Snakefile (or another copy's);
    `launcher`: a script that prepares the process and then runs Snakemake's CLI with the arguments."""
    snakemake = launcher or [sys.executable, "-m", "snakemake"]
    command = [*snakemake, "--snakefile", str(snakefile or REPO / "Snakefile"), *args]
    return subprocess.run(
        command,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def foreground_job(argv: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """`argv` as a terminal's foreground job, output to `log`: a process group of its own (a test's Ctrl-C is
    SIGINT to that group) with SIGINT at its default (a test suite started in the background, without job control,
    ignores SIGINT, and its children would inherit that and never see the interrupt)."""
    with log.open("wb") as handle:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )


def copy_of_the_code(target: Path) -> Path:
    """The repository's files as a fresh clone of this working tree would have them (no venv, no results)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    for name in listed:
        source, copy = REPO / name, target / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            copy.symlink_to(os.readlink(source))
        elif source.is_file():
            shutil.copy2(source, copy)
    return target


# Folders whose tests share one cluster per session (tests/iris, tests/slurm): one unit of work under pytest-xdist,
# so one worker starts the cluster (a second local Slurm cannot run beside the first: /run/slurm/conf is one link).
SHARED_CLUSTER_FOLDERS = ("iris", "slurm")


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to under `make test`'s pytest-xdist workers: its module (so module
    fixtures, such as the pipeline's one run, are made once), or its folder where that shares a cluster."""
    module = Path(nodeid.split("::", 1)[0])
    folder = module.parts[1] if len(module.parts) > 2 else ""
    return f"tests/{folder}" if folder in SHARED_CLUSTER_FOLDERS else module.as_posix()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Units that hold slow tests first, the most slow tests first, each unit's tests together: the workers (which
    take units in this order, `--no-loadscope-reorder`) start the long ones while the short ones fill in."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(unit_of(item.nodeid), []).append(item)
    slow = {unit: sum(1 for item in members if item.get_closest_marker("slow")) for unit, members in units.items()}
    items[:] = [item for unit in sorted(units, key=lambda u: -slow[u]) for item in units[unit]]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadscope` with `unit_of`'s units as the scopes (pytest-xdist's own `--dist loadgroup` marks do not
    reach pytest 9's node ids)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    return UnitScheduling(config, log)


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """After the slowest tests (`--durations`): where the suite's time went, folder by folder (setup, call and
    teardown of every test, fixtures included), so a slower CI names its folder."""
    totals: dict[str, float] = {}
    counts: dict[str, int] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if not isinstance(report, pytest.TestReport):
                continue
            folder = str(Path(report.nodeid.split("::", 1)[0]).parent)
            totals[folder] = totals.get(folder, 0.0) + report.duration
            if report.when == "call":
                counts[folder] = counts.get(folder, 0) + 1
    if not totals:
        return
    terminalreporter.write_sep("=", "time per folder (setup + call + teardown)")
    for folder, seconds in sorted(totals.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:9.1f} s  {counts.get(folder, 0):4d} tests  {folder}")
    terminalreporter.write_line(f"{sum(totals.values()):9.1f} s  {sum(counts.values()):4d} tests  (all)")
    terminalreporter.write_line(suite_time(time.time(), os.environ.get(CI_STARTED_ENV), _SESSION_STARTED))


CI_STARTED_ENV = "RLBUILD_CI_STARTED"  # .ci/run's start (epoch seconds): CI's budget counts its set-up too
CI_BUDGET_S = 35 * 60
_SESSION_STARTED = time.time()


def suite_time(now: float, ci_started: str | None, session_started: float) -> str:
    """`suite 31:40 of 35:00`: the wall time against CI's budget, from .ci/run's start where it says (set-up
    included), else from this session's start (set-up not included, so the margin is smaller than it reads)."""
    started, since = (float(ci_started), "since .ci/run started") if ci_started else (session_started, "pytest only")
    used = int(now - started)
    margin = CI_BUDGET_S - used
    left = f"{abs(margin) // 60}:{abs(margin) % 60:02d} {'left' if margin >= 0 else 'OVER'}"
    return f"suite {used // 60}:{used % 60:02d} of {CI_BUDGET_S // 60}:00 ({since}; {left})"
