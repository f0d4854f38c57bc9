"""Environments as preflight sees them: installed or not, and which version of whose code.

An environment (trainer/env.py) is an entry point of the group `rlbuild.environments` or a `module:Class` path.
Both are checked here without importing the environment or the trainer: an entry point from the installed
packages' metadata, a `module:Class` with `importlib.util.find_spec`. An environment from another package than
rlbuild brings its own version into the identity of what it scores (its distribution's version, or the digest of
its source for a module that no installed distribution owns); rlbuild's own are covered by the runtime digest.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points, packages_distributions, version
from pathlib import Path

from rlbuild.contracts.sources import SourceError, parse_source
from rlbuild.core.errors import Violation
from rlbuild.plan.spec import Experiment

GROUP = "rlbuild.environments"
OWN_DISTRIBUTION = "rlbuild"
OWN_PACKAGES = ("rlbuild", "trainer")


@dataclass(frozen=True)
class Installed:
    """An installed environment; `provider` is None for rlbuild's own, else `<distribution>==<version>` or
    `<module>@sha256:<digest of its source>`."""

    name: str
    provider: str | None


def _path_state() -> tuple[tuple[str, int], ...]:
    """The entries of the Python path that hold distributions, and when each last changed: installing or upgrading
    a package changes it. A folder of modules alone leaves it as it was (Snakemake puts each included rule file's
    folder on the path: entry points are not read again for it)."""
    state = []
    for entry in sys.path:
        with contextlib.suppress(OSError):
            changed = os.stat(entry or ".").st_mtime_ns
            if _holds_distributions(entry, changed):
                state.append((entry, changed))
    return tuple(state)


@functools.lru_cache(maxsize=256)
def _holds_distributions(entry: str, _changed: int) -> bool:
    """Whether importlib.metadata may find distributions in `entry` (a folder with a .dist-info or .egg-info, an
    .egg, or an archive), once per entry and change."""
    path = Path(entry or ".")
    if not path.is_dir() or path.suffix == ".egg":
        return path.exists()
    with contextlib.suppress(OSError):
        return any(name.endswith((".dist-info", ".egg-info")) for name in os.listdir(path))
    return False


@functools.lru_cache(maxsize=4)
def _declared(_state: tuple[tuple[str, int], ...]) -> dict[str, EntryPoint]:
    """The group's entry points by name, first declaration wins (reading every distribution's metadata costs
    ~25 ms, so once per state of the Python path)."""
    declared: dict[str, EntryPoint] = {}
    for entry in entry_points(group=GROUP):
        declared.setdefault(entry.name, entry)
    return declared


def installed_names() -> list[str]:
    return sorted(_declared(_path_state()))


def find_environment(name: str) -> Installed | None:
    """The environment `name` if it is installed (None otherwise)."""
    if ":" in name:
        return _find_module_class(name)
    return _declared_environment(name, _path_state())


@functools.lru_cache(maxsize=64)
def _declared_environment(name: str, state: tuple[tuple[str, int], ...]) -> Installed | None:
    """An entry point's environment and its distribution (reading `entry.dist` costs ~2 ms: once per name and
    state of the Python path, not once per version of a dry run)."""
    found = _declared(state).get(name)
    return Installed(name, _entry_point_provider(found)) if found else None


def _entry_point_provider(entry: EntryPoint) -> str | None:
    dist = entry.dist  # importlib.metadata always sets it for installed distributions
    return None if dist is None or dist.name == OWN_DISTRIBUTION else f"{dist.name}=={dist.version}"


def _find_module_class(path: str) -> Installed | None:
    module, _, attribute = path.partition(":")
    if not module or not attribute.isidentifier():
        return None
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    top = module.split(".")[0]
    if top in OWN_PACKAGES:
        return Installed(path, None)
    owners = packages_distributions().get(top)
    if owners:
        return Installed(path, f"{owners[0]}=={version(owners[0])}")
    return Installed(path, f"{module}@sha256:{_source_digest(spec)}")


def _source_digest(spec: importlib.machinery.ModuleSpec) -> str:
    """sha256 over a module's source file, or every .py file of a package, in path order."""
    locations = list(spec.submodule_search_locations or [])
    files = sorted(p for folder in locations for p in Path(folder).rglob("*.py")) if locations else []
    if not files and spec.origin:
        files = [Path(spec.origin)]
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def task_sources(experiment: Experiment) -> dict[str, str]:
    """`{field: task name}` of the experiment's `task:<name>/<split>` data sources."""
    out: dict[str, str] = {}
    for split in ("train", "validation"):
        for i, entry in enumerate(getattr(experiment.data, split)):
            try:
                source = parse_source(entry.source, entry.revision)
            except SourceError:
                continue  # reported by check_sources
            if source.scheme == "task":
                out[f"data.{split}.{i}.source"] = source.task[0]
    return out


def check_environments(experiment: Experiment, env_class: str | None) -> list[Violation]:
    """Every environment the experiment names (tasks of its data, the recipe's env_class) must be installed."""
    named = {**task_sources(experiment)}
    if env_class is not None:
        named["recipe.environment.env_class"] = env_class
    known = installed_names()
    out: list[Violation] = []
    for field, name in named.items():
        if find_environment(name) is not None:
            continue
        close = difflib.get_close_matches(name, known, n=1)
        out.append(
            Violation(
                field,
                f"environment {name!r} is not installed (installed: {', '.join(known) or 'none'})",
                (f"did you mean {close[0]!r}? " if close else "")
                + f"install the package that declares it under the entry point group {GROUP!r}, or write "
                "module:Class for a class on the Python path",
            )
        )
    return out


def providers(names: list[str]) -> dict[str, str]:
    """`{name: provider}` of the environments among `names` that do not come with rlbuild (they enter identity)."""
    found = {name: find_environment(name) for name in sorted(set(names))}
    return {name: env.provider for name, env in found.items() if env is not None and env.provider is not None}
