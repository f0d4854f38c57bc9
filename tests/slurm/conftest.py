"""Fixtures: one real local Slurm cluster per test session (tests/slurm/local_cluster.py) and helpers to run
`snakemake` against it as a user would. Without Slurm's binaries (scripts/install-slurm.sh installs them; CI
does) or root, the tests that need the cluster skip and say why."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.local_cluster import LocalSlurm, missing_binaries

WORKFLOW = Path(__file__).parent / "workflow"


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed (missing {', '.join(missing)}); scripts/install-slurm.sh installs it")
    if os.geteuid() != 0:
        pytest.skip("the local Slurm cluster runs its daemons as root (slurmd must), and this is not root")
    with LocalSlurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


def snakemake_env(cluster: LocalSlurm, home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        **cluster.env,
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "RAY_USAGE_STATS_ENABLED": "0",
        **(extra or {}),
    }


def fast_flags() -> list[str]:
    """The plugin's status checks, quick enough for tests; squeue, as the cluster keeps no accounting."""
    return [
        "--slurm-status-command",
        "squeue",
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--seconds-between-status-checks",
        "2",
        "--slurm-keep-successful-logs",
    ]


def workflow_copy(tmp_path: Path) -> Path:
    workdir = tmp_path / "wf"
    workdir.mkdir()
    (workdir / "Snakefile").write_text((WORKFLOW / "Snakefile").read_text())
    return workdir
