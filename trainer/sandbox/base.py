"""The seam between the trainer and a sandbox provider: one small interface, implemented once per package
(`trainer/sandbox/local/`: bubblewrap on this node; `trainer/sandbox/harbor/`: Harbor's own environments, one
provider per backend that names a Harbor environment type); `trainer/sandbox/registry.py` finds one by the recipe's
`environment.sandbox.backend`.

What an episode asks of a provider, and nothing more: a sandbox started in a folder of the episode's files (for
an agent environment that takes one from the player's pool), or Harbor's environment for a task (which a Harbor
task's sandbox, trainer/sandbox/task.py, drives: commands, the task's verifier, stop) and the event loop that
environment's calls run on. What a provider needs where the episodes run (credentials, the Harbor type, the
runtime's extra) is declared once in rlbuild/contracts/recipe.py `SANDBOX_PROVIDERS`, where the plan reads it.
"""

from __future__ import annotations

import asyncio
import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rlbuild.contracts.recipe import SandboxSection
from trainer.sandbox import Sandbox, SandboxError


class Reusable(Sandbox, Protocol):
    """A sandbox started from an episode's files, which the pool (trainer/sandbox/pool.py) can lend again."""

    @property
    def ended(self) -> bool: ...

    def reset(self) -> None: ...

    def load(self, files: Mapping[str, str | bytes]) -> None: ...


class Provider(ABC):
    """One sandbox backend as the trainer drives it, registered under `name` (`environment.sandbox.backend`)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def start(self, spec: SandboxSection, folder: Path) -> Reusable:
        """A started sandbox whose working folder is `folder` (the episode's files, written); the sandbox owns the
        folder from then on. A provider whose sandboxes only Harbor starts, from a task's image, has none."""
        raise SandboxError(
            f"environment.sandbox.backend {self.name!r} starts sandboxes for Harbor tasks only (from the task's "
            "image), and this environment asks for one holding its episode's files: use environment.env_class "
            "harbor with a harbor: data source, or a backend that starts a sandbox on the node"
        )

    @abstractmethod
    def task_environment(self, spec: SandboxSection, keywords: dict[str, Any]) -> Any:
        """Harbor's environment (a harbor.environments.base.BaseEnvironment) for one task, built from the keywords
        Harbor's own trials build one with."""

    def event_loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop every task environment of this provider runs on, on a thread of its own; None: each sandbox
        keeps a loop of its own."""
        return None


def harbor_module(name: str) -> Any:
    """One of Harbor's modules, imported when a task needs it (a run without Harbor tasks never loads Harbor), or
    the error that says how to install it on the node."""
    try:
        return importlib.import_module(name)
    except ImportError as error:
        raise SandboxError(
            f"Harbor tasks need the `harbor` extra on the node ({error}); install it with "
            "`scripts/setup.sh --extra harbor` (rlbuild check says which runtime the nodes use)"
        ) from None
