"""What the nodes of a job run, judged on the machine that plans it, which is often a laptop without a GPU stack.

Where Snakemake shares software deployment with the jobs (the local executor; Slurm's shared file system), the
nodes run this checkout's .venv, and that is what is judged. Elsewhere the nodes run what the experiment declares:
`runtime.image` (pinned by digest), or an environment set up from the bundle's uv.lock with the `gpu` extra on GPU
topologies; the lock's resolution for the nodes' platform is read, never the packages installed here.
"""

from __future__ import annotations

import importlib.util
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal

from rlbuild.contracts.launch import CPU_VARIANT
from rlbuild.contracts.runtime import LOCK_FILE, REPO_ROOT
from rlbuild.plan.spec import Experiment

GPU_EXTRA = "gpu"  # pyproject.toml's extra that adds vLLM (scripts/setup.sh --extra gpu)
PROJECT = "rlbuild"
# The platform of GPU nodes: the lock's markers are evaluated for it, and a wheel must exist for it.
NODE_MARKERS = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
NODE_WHEEL_TAG = "x86_64"


@dataclass(frozen=True)
class NodeRuntime:
    """Where the nodes' packages come from, and the vLLM they will have (None: none; for an image, not known
    here: each node checks its own before Ray starts)."""

    origin: Literal["venv", "lock", "image"]
    vllm: str | None
    image: str | None = None
    extra: str | None = None

    def describe(self) -> str:
        if self.origin == "image":
            return f"image {self.image}"
        if self.origin == "lock":
            extra = f" with extra {self.extra}" if self.extra else ""
            return f"set up from {LOCK_FILE}{extra} (Snakemake shares no software deployment with the jobs)"
        return "this checkout's .venv (shared with the jobs)"


def on_gpus(experiment: Experiment) -> bool:
    return experiment.topology.gpu_variant.lower() != CPU_VARIANT


def node_runtime(experiment: Experiment, *, shares_venv: bool) -> NodeRuntime:
    """The runtime the experiment's nodes run; `shares_venv`: they run this checkout's .venv (Snakemake shares
    software deployment with its jobs)."""
    if shares_venv:
        return NodeRuntime("venv", installed_vllm())
    if experiment.runtime.image is not None:
        return NodeRuntime("image", None, image=experiment.runtime.image)
    extra = GPU_EXTRA if on_gpus(experiment) else None
    return NodeRuntime("lock", locked_vllm(extra) if extra else None, extra=extra)


def installed_vllm() -> str | None:
    """The vLLM installed where this runs, or None; never imported here (it takes seconds and may need a GPU)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        return version("vllm")
    except PackageNotFoundError:
        return "unknown version"


def locked_vllm(extra: str, lock: Path = REPO_ROOT / LOCK_FILE) -> str | None:
    """The vLLM version the lock installs on the nodes' platform with `extra`, or None (not in that extra, a
    marker that excludes the platform, or no wheel for it)."""
    return _locked_vllm(lock, lock.stat().st_mtime_ns if lock.is_file() else 0, extra)


@cache
def _locked_vllm(lock: Path, _mtime: int, extra: str) -> str | None:
    from packaging.markers import Marker  # here: only a run whose nodes set up the lock pays its import

    if not lock.is_file():
        return None
    packages = tomllib.loads(lock.read_text()).get("package", [])
    project = next((p for p in packages if p.get("name") == PROJECT), {})
    wanted = [d for d in project.get("optional-dependencies", {}).get(extra, []) if d.get("name") == "vllm"]
    if not any(Marker(d["marker"]).evaluate(NODE_MARKERS) if "marker" in d else True for d in wanted):
        return None
    for package in (p for p in packages if p.get("name") == "vllm"):
        wheels = [w.get("url", "") for w in package.get("wheels", [])]
        if any(NODE_WHEEL_TAG in url.rsplit("/", 1)[-1] for url in wheels) or "sdist" in package:
            return str(package["version"])
    return None
