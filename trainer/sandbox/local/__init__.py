"""The `local` provider: bubblewrap on this node (bubblewrap.py), for an episode given as files and, as a Harbor
environment class, for a Harbor task whose Dockerfile it can lay out without building (harbor_environment.py).
Harbor is imported only when a task's environment is made: a run without Harbor tasks never loads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlbuild.contracts.recipe import SandboxSection
from trainer.sandbox.base import Provider
from trainer.sandbox.local.bubblewrap import LocalSandbox


class LocalProvider(Provider):
    def start(self, spec: SandboxSection, folder: Path) -> LocalSandbox:
        return LocalSandbox(spec, folder)

    def task_environment(self, spec: SandboxSection, keywords: dict[str, Any]) -> Any:
        from trainer.sandbox.local.harbor_environment import BubblewrapEnvironment

        return BubblewrapEnvironment(**keywords, sandbox_spec=spec)


PROVIDER = LocalProvider("local")
