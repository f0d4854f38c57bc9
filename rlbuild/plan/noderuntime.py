"""What the nodes of a job run, judged on the machine that plans it, which is often a laptop without a GPU stack.

Where Snakemake shares software deployment with the jobs (the local executor; Slurm's shared file system), the
nodes run this checkout's .venv, and that is what is judged. Elsewhere the nodes run what the experiment declares:
`runtime.image` (pinned by digest), or an environment set up from the bundle's uv.lock with the `gpu` extra on GPU
topologies and the `harbor` extra where Harbor plays the episodes; the lock's resolution for the nodes' platform is
read, never the packages installed here.
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
from rlbuild.contracts.recipe import HARBOR_EXTRA, SANDBOX_PROVIDERS
from rlbuild.contracts.runtime import LOCK_FILE, REPO_ROOT
from rlbuild.plan.spec import Experiment

GPU_EXTRA = "gpu"  # pyproject.toml's extra that adds vLLM (scripts/setup.sh --extra gpu)
PROJECT = "rlbuild"
# The platform of GPU nodes: the lock's markers are evaluated for it, and a wheel must exist for it.
NODE_MARKERS = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
NODE_WHEEL_TAG = "x86_64"


@dataclass(frozen=True)
class NodeRuntime:
    """Where the nodes' packages come from, and the vLLM and Harbor they will have (None: none, or Harbor not
    needed; for an image, not known here: each node checks its own before Ray starts)."""

    origin: Literal["venv", "lock", "image"]
    vllm: str | None
    image: str | None = None
    extras: tuple[str, ...] = ()
    harbor: str | None = None

    def describe(self) -> str:
        if self.origin == "image":
            return f"image {self.image}"
        if self.origin == "lock":
            named = f" with extra{'s' if len(self.extras) > 1 else ''} {', '.join(self.extras)}" if self.extras else ""
            return f"set up from {LOCK_FILE}{named} (Snakemake shares no software deployment with the jobs)"
        return "this checkout's .venv (shared with the jobs)"


def on_gpus(experiment: Experiment) -> bool:
    return experiment.topology.gpu_variant.lower() != CPU_VARIANT


def harbor_needed(experiment: Experiment) -> bool:
    """Whether Harbor plays the episodes: the sandbox backend is one of Harbor's environments, or a data source is
    a Harbor task set (Harbor's task loader and verifier run it). Read from the experiment as written: the role plan
    renders no sandbox key, and a backend that does not parse is validation's to report."""
    environment = experiment.recipe.get("environment")
    sandbox = environment.get("sandbox") if isinstance(environment, dict) else None
    backend = sandbox.get("backend", "local") if isinstance(sandbox, dict) else None
    provider = SANDBOX_PROVIDERS.get(backend) if isinstance(backend, str) else None
    if provider is not None and provider.extra == HARBOR_EXTRA:
        return True
    entries = [*experiment.data.train, *experiment.data.validation]
    return any(entry.source.strip().startswith("harbor:") for entry in entries)


def node_runtime(experiment: Experiment, *, shares_venv: bool) -> NodeRuntime:
    """The runtime the experiment's nodes run; `shares_venv`: they run this checkout's .venv (Snakemake shares
    software deployment with its jobs)."""
    harbor = harbor_needed(experiment)
    if shares_venv:
        return NodeRuntime("venv", installed_version("vllm"), harbor=installed_version("harbor") if harbor else None)
    if experiment.runtime.image is not None:
        return NodeRuntime("image", None, image=experiment.runtime.image)
    extras = (GPU_EXTRA,) if on_gpus(experiment) else ()
    extras += (HARBOR_EXTRA,) if harbor else ()
    vllm = locked_version("vllm", GPU_EXTRA) if GPU_EXTRA in extras else None
    locked_harbor = locked_version("harbor", HARBOR_EXTRA) if harbor else None
    return NodeRuntime("lock", vllm, extras=extras, harbor=locked_harbor)


def installed_version(package: str) -> str | None:
    """The version of `package` installed where this runs, or None; never imported here (vLLM takes seconds and
    may need a GPU; Harbor pulls its providers' clients)."""
    if importlib.util.find_spec(package) is None:
        return None
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown version"


def locked_version(package: str, extra: str, lock: Path = REPO_ROOT / LOCK_FILE) -> str | None:
    """The version of `package` the lock installs on the nodes' platform with `extra`, or None (not in that extra,
    a marker that excludes the platform, or no wheel for it)."""
    return _locked_version(lock, lock.stat().st_mtime_ns if lock.is_file() else 0, package, extra)


@cache
def _locked_version(lock: Path, _mtime: int, package: str, extra: str) -> str | None:
    from packaging.markers import Marker  # here: only a run whose nodes set up the lock pays its import

    if not lock.is_file():
        return None
    packages = tomllib.loads(lock.read_text()).get("package", [])
    project = next((p for p in packages if p.get("name") == PROJECT), {})
    wanted = [d for d in project.get("optional-dependencies", {}).get(extra, []) if d.get("name") == package]
    if not any(Marker(d["marker"]).evaluate(NODE_MARKERS) if "marker" in d else True for d in wanted):
        return None
    for found in (p for p in packages if p.get("name") == package):
        wheels = [w.get("url", "").rsplit("/", 1)[-1] for w in found.get("wheels", [])]
        if any(NODE_WHEEL_TAG in wheel or wheel.endswith("-any.whl") for wheel in wheels) or "sdist" in found:
            return str(found["version"])
    return None
