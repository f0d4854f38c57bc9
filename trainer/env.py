"""Environments, found as plug-ins: the recipe's `environment.env_class` and a `task:<name>/<split>` data source
name one.

An environment is either a class whose instances score one completion of one dataset row (`reward`), or an agent
environment in skyrl-gym's text convention, built per episode and played turn by turn (`init`, `step`:
trainer/agents/episodes.py). Either kind that also generates `{prompt, answer}` rows (`rows(split, revision)`) is a
task. A name is either an entry point of the group `rlbuild.environments` (a package declares it in its metadata;
rlbuild's own are declared in pyproject.toml) or `module:Class`. rlbuild's preflight checks the same names
without importing anything (rlbuild/plan/environments.py).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from trainer.errors import TrainerError

GROUP = "rlbuild.environments"


@runtime_checkable
class Environment(Protocol):
    def reward(self, row: dict[str, Any], completion: str, finished: bool) -> float:
        """`completion` is the decoded text without special tokens; `finished` says it ended with <eos>."""
        ...


@runtime_checkable
class EpisodeEnvironment(Protocol):
    """skyrl-gym's text environment, recognised by shape (skyrl-gym itself is not a dependency): built as
    `Env(env_config, extras)` for each episode, then `init` once and `step` once per action."""

    def init(self, prompt: str) -> tuple[str, dict[str, Any]]: ...

    def step(self, action: str) -> Mapping[str, Any]:
        """`{observations: [{role, content}], reward, done, metadata}` for one action."""
        ...


@runtime_checkable
class Task(Protocol):
    def rows(self, split: str, revision: str) -> list[dict[str, Any]]:
        """The `{prompt, answer}` rows of `split`, reproducible from `revision`."""
        ...


class UnknownEnvironmentError(TrainerError):
    """An environment name that names no installed environment, or a class that is not one."""


def is_episode_class(environment: type) -> bool:
    """An agent environment: it has `init` and `step` (skyrl-gym's convention), whatever else it has."""
    return callable(getattr(environment, "init", None)) and callable(getattr(environment, "step", None))


def load_class(name: str) -> type:
    if ":" in name:
        module, _, attribute = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as exc:
            raise UnknownEnvironmentError(f"environment {name!r}: {exc}; check the module:Class path") from None
    found = entry_points(group=GROUP, name=name)
    if not found:
        known = sorted(ep.name for ep in entry_points(group=GROUP))
        raise UnknownEnvironmentError(
            f"environment {name!r} is not installed; installed: {', '.join(known)}. Install the package that "
            f"declares it (entry point group {GROUP!r}) or write module:Class"
        )
    return next(iter(found)).load()


def make(name: str) -> Environment:
    """An instance of the environment `name` (an entry point name or `module:Class`)."""
    environment = load_class(name)()
    if not isinstance(environment, Environment):
        raise UnknownEnvironmentError(f"environment {name!r} has no reward(row, completion, finished) method")
    return environment


def make_task(name: str) -> Task:
    """An environment that generates rows (a `task:<name>/<split>` data source): a reward environment, or an agent
    environment built without an episode (`Env()`) just to generate them."""
    environment = load_class(name)()
    if not isinstance(environment, Task):
        raise UnknownEnvironmentError(
            f"environment {name!r} generates no rows (it has no rows(split, revision) method)"
        )
    return environment


class ExactMatch:
    """1.0 when the completion is exactly the answer and generation stopped with <eos>, else 0.0."""

    def reward(self, row: dict[str, Any], completion: str, finished: bool) -> float:
        return 1.0 if finished and completion == str(row["answer"]) else 0.0
