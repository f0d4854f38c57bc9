"""What the nodes of a job run, judged on the machine that plans it, which is often a laptop without a GPU stack.

Where Snakemake shares software deployment with the jobs (the local executor; a cluster's shared file system),
the nodes run this checkout's .venv, and that is what is judged, unless `runtime.image` names an image Apptainer
runs (a SIF file or a docker:// reference: the train gang runs inside it). Elsewhere (jobs that run a bundle of
the checkout) the nodes run what the experiment declares: `runtime.image` (pinned by digest), or an environment
set up from the bundle's uv.lock with the `gpu` extra on GPU topologies and the `harbor` extra where Harbor plays
the episodes; the lock's resolution for the nodes' platform (`topology.platform`: x86_64, or aarch64 for Grace
nodes) is read, never the packages installed here. An image's packages are what `runtime.image_provides`
declares; each node checks that declaration.
"""

from __future__ import annotations

import importlib.util
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Literal

from rlbuild.contracts.launch import CPU_VARIANT, PINNED_SIF, apptainer_target
from rlbuild.contracts.recipe import HARBOR_EXTRA, SANDBOX_PROVIDERS, SandboxSection
from rlbuild.contracts.runtime import LOCK_FILE, REPO_ROOT
from rlbuild.core.errors import Violation
from rlbuild.core.paths import path_problem
from rlbuild.plan.spec import Experiment, NodePlatform
from rlbuild.stages.staging import cached_sha256

GPU_EXTRA = "gpu"  # pyproject.toml's extra that adds vLLM (scripts/setup.sh --extra gpu)
PROJECT = "rlbuild"
DEFAULT_PLATFORM: NodePlatform = "x86_64"


def node_markers(platform: NodePlatform) -> dict[str, str]:
    """The marker environment of a Linux node of `platform`: the lock's markers are evaluated for it."""
    return {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": platform}


@dataclass(frozen=True)
class NodeRuntime:
    """Where the nodes' packages come from, and the vLLM and Harbor they will have (None: none, or Harbor not
    needed; for an image, not known here: each node checks its own before Ray starts)."""

    origin: Literal["venv", "lock", "image"]
    vllm: str | None
    image: str | None = None
    extras: tuple[str, ...] = ()
    harbor: str | None = None
    platform: NodePlatform = DEFAULT_PLATFORM
    provides: dict[str, str] | None = None  # what the image declares it holds (runtime.image_provides)

    def describe(self) -> str:
        if self.origin == "image":
            declared = ", ".join(f"{k} {v}" for k, v in (self.provides or {}).items()) or "nothing declared"
            if apptainer_target(self.image) is not None:
                return f"Apptainer image {self.image} (apptainer exec --nv on every node of the train gang; {declared})"
            return f"image {self.image} ({declared})"
        if self.origin == "lock":
            named = f" with extra{'s' if len(self.extras) > 1 else ''} {', '.join(self.extras)}" if self.extras else ""
            return (
                f"set up from {LOCK_FILE}{named} for linux/{self.platform} (Snakemake shares no software deployment "
                "with the jobs)"
            )
        return "this checkout's .venv (shared with the jobs)"


def on_gpus(experiment: Experiment) -> bool:
    return experiment.topology.gpu_variant.lower() != CPU_VARIANT


def harbor_needed(experiment: Experiment) -> bool:
    """Whether Harbor plays the episodes: the sandbox backend is one of Harbor's environments, or a data source is
    a Harbor task set (Harbor's task loader and verifier run it). Read from the experiment as written: the role plan
    renders no sandbox key, and a backend that does not parse is validation's to report."""
    environment = experiment.recipe.get("environment")
    sandbox = environment.get("sandbox") if isinstance(environment, dict) else None
    default = SandboxSection.model_fields["backend"].default
    backend = sandbox.get("backend", default) if isinstance(sandbox, dict) else None
    provider = SANDBOX_PROVIDERS.get(backend) if isinstance(backend, str) else None
    if provider is not None and provider.extra == HARBOR_EXTRA:
        return True
    entries = [*experiment.data.train, *experiment.data.validation]
    return any(entry.source.strip().startswith("harbor:") for entry in entries)


def node_runtime(experiment: Experiment, *, shares_venv: bool) -> NodeRuntime:
    """The runtime the experiment's nodes run; `shares_venv`: they run this checkout's .venv (Snakemake shares
    software deployment with its jobs)."""
    harbor = harbor_needed(experiment)
    image, provides = experiment.runtime.image, experiment.runtime.image_provides
    platform = experiment.topology.platform
    if image is not None and (not shares_venv or apptainer_target(image) is not None):
        declared = provides or {}
        vllm, image_harbor = declared.get("vllm"), declared.get("harbor")
        return NodeRuntime("image", vllm, image=image, harbor=image_harbor, platform=platform, provides=provides)
    if shares_venv:
        return NodeRuntime(
            "venv", installed_version("vllm"), harbor=installed_version("harbor") if harbor else None, platform=platform
        )
    extras = (GPU_EXTRA,) if on_gpus(experiment) else ()
    extras += (HARBOR_EXTRA,) if harbor else ()
    vllm = locked_version("vllm", GPU_EXTRA, platform=platform) if GPU_EXTRA in extras else None
    locked_harbor = locked_version("harbor", HARBOR_EXTRA, platform=platform) if harbor else None
    return NodeRuntime("lock", vllm, extras=extras, harbor=locked_harbor, platform=platform)


def image_problems(experiment: Experiment, *, shares_venv: bool) -> list[Violation]:
    """An Apptainer image runs where the jobs share this host's file system (jobs that run a bundle of the checkout
    take an OCI task image), and a SIF file is on this host, which shares its file system with the nodes, with the
    bytes its pin names (hashed once per file version: a SIF is gigabytes)."""
    image = experiment.runtime.image
    if apptainer_target(image) is None:
        return []
    if not shares_venv:
        return [
            Violation(
                "runtime.image",
                f"{image}: Apptainer images (a SIF file, a docker:// reference) run where the jobs share this "
                "checkout's file system, and this profile's jobs run a bundle of it, which takes an OCI image",
                "pin an OCI image as registry/name@sha256:<digest> for this profile, or run with a profile whose "
                "jobs share the checkout (shared-fs-usage: software-deployment)",
            )
        ]
    sif = PINNED_SIF.match(image or "")
    if sif is None:
        return []  # docker://: Apptainer pulls it by digest on each node; no registry is asked from here
    path, pinned = Path(sif.group(1)), sif.group(2)
    problem = path_problem(path, "file")
    if problem is not None:
        fix = "copy the SIF there (a path the nodes share: they run it from the same path), or fix runtime.image"
        return [Violation("runtime.image", f"{path} {problem} on this host, which shares the nodes' files", fix)]
    found = cached_sha256(path)
    if found != pinned:
        return [
            Violation(
                "runtime.image",
                f"{path} has sha256 {found}, not the {pinned} its pin names: the file was replaced or rebuilt",
                f"pin the file's digest ({path}@sha256:{found}) if this is the image to train with, or put the "
                "pinned file back",
            )
        ]
    return []


def installed_version(package: str) -> str | None:
    """The version of `package` installed where this runs, or None; never imported here (vLLM takes seconds and
    may need a GPU; Harbor pulls its providers' clients)."""
    if importlib.util.find_spec(package) is None:
        return None
    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown version"


def locked_version(
    package: str, extra: str, lock: Path = REPO_ROOT / LOCK_FILE, *, platform: NodePlatform = DEFAULT_PLATFORM
) -> str | None:
    """The version of `package` the lock installs on Linux nodes of `platform` with `extra`, or None (not in that
    extra, a marker that excludes the platform, or no wheel for it)."""
    return _locked_version(lock, lock.stat().st_mtime_ns if lock.is_file() else 0, package, extra, platform)


@cache
def _locked_version(lock: Path, _mtime: int, package: str, extra: str, platform: NodePlatform) -> str | None:
    from packaging.markers import Marker  # here: only a run whose nodes set up the lock pays its import

    if not lock.is_file():
        return None
    packages = tomllib.loads(lock.read_text()).get("package", [])
    project = next((p for p in packages if p.get("name") == PROJECT), {})
    wanted = [d for d in project.get("optional-dependencies", {}).get(extra, []) if d.get("name") == package]
    if not any(Marker(d["marker"]).evaluate(node_markers(platform)) if "marker" in d else True for d in wanted):
        return None
    for found in (p for p in packages if p.get("name") == package):
        wheels = [w.get("url", "").rsplit("/", 1)[-1] for w in found.get("wheels", [])]
        built = any("linux" in wheel and f"_{platform}" in wheel for wheel in wheels)
        if built or any(wheel.endswith("-any.whl") for wheel in wheels) or "sdist" in found:
            return str(found["version"])
    return None
