"""Environments as preflight sees them: installed or not, and which version of whose code.

An environment (trainer/env.py) is an entry point of the group `rlbuild.environments` or a `module:Class` path.
Both are checked here without importing the environment or the trainer: an entry point from the installed
packages' metadata, a `module:Class` with `importlib.util.find_spec`. An environment from another package than
rlbuild brings its own version into the identity of what it scores (its distribution's version, or the digest of
its source for a module that no installed distribution owns); rlbuild's own are covered by the runtime digest.

The sandboxes the episodes run in are checked here too (`check_sandbox`): how many a step holds at once against
the engines and the provider's cap, Harbor in the runtime the nodes will run, and each Harbor task against the
backend that must run its Dockerfile.
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

from rlbuild.contracts.recipe import BUILDING_BACKENDS, HARBOR_EXTRA, IMAGELESS_BACKENDS, SANDBOX_PROVIDERS, Recipe
from rlbuild.contracts.rows import (
    HarborTaskError,
    LocalImage,
    TaskProblem,
    local_image,
    task_folders,
    task_problems,
)
from rlbuild.contracts.sources import Source, SourceError, parse_source
from rlbuild.core.errors import Violation
from rlbuild.plan.noderuntime import NodeRuntime, harbor_needed
from rlbuild.plan.spec import Experiment
from rlbuild.schedulers.registry import cluster_names

GROUP = "rlbuild.environments"
CONCURRENT_FIELD = "recipe.environment.sandbox.max_concurrent"
INSTALL_HARBOR = "scripts/setup.sh --extra harbor"
# Tasks refused one by one before the rest are counted: a set of 1000 tasks must not bury the other problems.
LISTED_TASKS = 10
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


def _data_sources(experiment: Experiment, scheme: str) -> dict[str, Source]:
    """`{field: parsed source}` of the experiment's data sources of one scheme."""
    out: dict[str, Source] = {}
    for split in ("train", "validation"):
        for i, entry in enumerate(getattr(experiment.data, split)):
            try:
                source = parse_source(entry.source, entry.revision)
            except SourceError:
                continue  # reported by check_sources
            if source.scheme == scheme:
                out[f"data.{split}.{i}.source"] = source
    return out


def task_sources(experiment: Experiment) -> dict[str, str]:
    """`{field: task name}` of the experiment's `task:<name>/<split>` data sources."""
    return {field: source.task[0] for field, source in _data_sources(experiment, "task").items()}


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


def check_sandbox(experiment: Experiment, recipe: Recipe, nodes: NodeRuntime) -> list[Violation]:
    """The sandboxes as the plan will hold them: how many at once, Harbor where it plays the episodes, and every
    Harbor task against the backend that must build (or not build) its image."""
    found = check_concurrency(experiment, recipe) + check_harbor_runtime(experiment, recipe, nodes)
    return found + check_harbor_tasks(experiment, recipe)


def check_concurrency(experiment: Experiment, recipe: Recipe) -> list[Violation]:
    """Sandboxes at once are K per engine x engines (seed 003: K x engines = n_concurrent_trials), and within the
    provider's cap where `execution.sandbox_caps` declares one. Unbounded (null), the episode player plays every
    episode of a sample batch at once (trainer/agents/episodes.py: train_batch_size x n_samples_per_prompt, all
    engines together), so that is what must fit the cap."""
    sandbox = recipe.environment.sandbox
    if sandbox is None:
        return []
    engines, backend = recipe.generator.num_inference_engines, sandbox.backend
    cap = experiment.execution.sandbox_caps.get(backend)
    wanted = sandbox.max_concurrent
    if wanted is None:
        t, g = recipe.trainer, recipe.generator
        episodes = t.train_batch_size * g.n_samples_per_prompt
        if cap is None or episodes <= cap:
            return []
        message = (
            f"null holds every episode of a step at once: train_batch_size {t.train_batch_size} x "
            f"n_samples_per_prompt {g.n_samples_per_prompt} = {episodes} {backend} sandboxes, more than "
            f"execution.sandbox_caps.{backend}={cap}"
        )
        return [Violation(CONCURRENT_FIELD, message, _within_cap(engines, cap, backend))]
    if cap is not None and wanted > cap:
        message = f"{wanted} {backend} sandboxes at once, more than execution.sandbox_caps.{backend}={cap}"
        return [Violation(CONCURRENT_FIELD, message, _within_cap(engines, cap, backend))]
    if wanted % engines == 0:
        return []
    below = wanted // engines * engines
    nearest = [str(v) for v in (below, below + engines) if v >= engines and (cap is None or v <= cap)]
    message = (
        f"{wanted} is not a multiple of role_plan.num_inference_engines={engines}: each engine drives K sandboxes "
        "(K x engines, seed 003's n_concurrent_trials)"
    )
    return [Violation(CONCURRENT_FIELD, message, f"use {' or '.join(nearest)}")]


def _within_cap(engines: int, cap: int, backend: str) -> str:
    fits = cap // engines * engines
    if fits:
        return f"set {CONCURRENT_FIELD}: {fits} ({fits // engines} per engine x {engines} engine(s))"
    return (
        f"the cap holds fewer sandboxes than there are engines ({engines}): raise execution.sandbox_caps.{backend} "
        f"to at least {engines} if the provider allows it, or plan fewer engines"
    )


def check_harbor_runtime(experiment: Experiment, recipe: Recipe, nodes: NodeRuntime) -> list[Violation]:
    """Harbor must be in the runtime the nodes will run where it plays the episodes: this .venv where the jobs share
    it, the lock's `harbor` extra for the nodes' platform where they set up from it. An image is checked by each
    node before Ray starts (gang.check_rollout_backend)."""
    if nodes.origin == "image" or nodes.harbor is not None or not harbor_needed(experiment):
        return []
    sandbox = recipe.environment.sandbox
    provider = SANDBOX_PROVIDERS[sandbox.backend] if sandbox is not None else None
    if sandbox is not None and provider is not None and provider.extra == HARBOR_EXTRA:
        field = "recipe.environment.sandbox.backend"
        why = f"backend {sandbox.backend!r} starts each episode's sandbox through Harbor ({provider.harbor_type})"
    else:
        field = next(iter(_data_sources(experiment, "harbor")))
        why = "a harbor: task set is loaded and verified by Harbor where the episodes run"
    if nodes.origin == "venv":
        where = "the nodes run this checkout and its .venv, where harbor is not importable"
        fix = (
            f"install the {HARBOR_EXTRA!r} extra with `{INSTALL_HARBOR}`; if the jobs do not run this .venv, "
            f"judge the runtime they do run with `rlbuild check --profile {cluster_names()}`"
        )
    else:
        where = f"the nodes set up from uv.lock with extras {', '.join(nodes.extras)}, which resolve no harbor for "
        where += f"linux/{nodes.platform}"
        fix = (
            f"declare harbor in pyproject's {HARBOR_EXTRA!r} extra and run `uv lock`, or pin runtime.image (this "
            "judged the profile's nodes: `rlbuild check` without --profile judges this machine's .venv)"
        )
    return [Violation(field, f"{why}, and the runtime the job will use has none: {where}", fix)]


def check_harbor_tasks(experiment: Experiment, recipe: Recipe) -> list[Violation]:
    """Every task of every `harbor:` source is a task (no link in its folder), and one the sandbox backend can run:
    on a backend that builds no image, a task whose Dockerfile needs a build (a RUN line, a compose file, a
    prebuilt image) is refused, and so is a COPY from outside its build context. One line per problem."""
    sandbox = recipe.environment.sandbox
    building = ", ".join(BUILDING_BACKENDS)
    out: list[Violation] = []
    for field, source in _data_sources(experiment, "harbor").items():
        root = source.local_path()
        if not root.exists():
            continue  # check_sources names the missing path
        try:
            tasks = task_folders(root)
        except HarborTaskError as error:
            out.append(Violation(field, str(error)))
            continue
        problems = {task: task_problems(task) for task in tasks}
        out += _listed(field, str(source), [problem for found in problems.values() for problem in found])
        if sandbox is None:
            message = f"{source}: a Harbor task runs its commands and verifier in a sandbox, and recipe.environment."
            message += "sandbox is null"
            fix = f"set recipe.environment.sandbox.backend: one of {building} (or {', '.join(IMAGELESS_BACKENDS)}, "
            fix += "for tasks that build nothing)"
            out.append(Violation(field, message, fix))
        elif not SANDBOX_PROVIDERS[sandbox.backend].builds_images:
            images = [(task.name, local_image(task)) for task, found in problems.items() if not found]
            out += _unbuildable(field, str(source), sandbox.backend, images)
            refused = [problem for _, image in images if isinstance(image, LocalImage) for problem in image.problems]
            out += _listed(field, str(source), refused)
    return out


def _listed(field: str, source: str, problems: list[TaskProblem]) -> list[Violation]:
    """One line per problem (its path and line, why, the fix), the first LISTED_TASKS of them and a count."""
    out = [Violation(field, f"{problem.where}: {problem.why}", problem.fix) for problem in problems[:LISTED_TASKS]]
    if len(problems) > LISTED_TASKS:
        out.append(Violation(field, f"and {len(problems) - LISTED_TASKS} more problems in the tasks of {source}"))
    return out


def _unbuildable(field: str, source: str, backend: str, images: list[tuple[str, LocalImage | str]]) -> list[Violation]:
    refused = [(name, reason) for name, reason in images if isinstance(reason, str)]
    fix = f"set recipe.environment.sandbox.backend to one of {', '.join(BUILDING_BACKENDS)} (they build the image)"
    out = [
        Violation(
            field,
            f"task {name!r} of {source}: {reason}, and sandbox backend {backend!r} builds no image (it runs a "
            "Dockerfile of FROM, WORKDIR, COPY, ENV and the like on the node's own programs)",
            f"{fix}, or take the task out of the set",
        )
        for name, reason in refused[:LISTED_TASKS]
    ]
    if len(refused) > LISTED_TASKS:
        more = f"and {len(refused) - LISTED_TASKS} more tasks of {source} need their image built"
        out.append(Violation(field, more, fix))
    return out
