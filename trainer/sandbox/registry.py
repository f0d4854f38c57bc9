"""Every sandbox provider the trainer knows, by the name a recipe gives it (`environment.sandbox.backend`): the one
place a backend's name meets its package. Each name is declared once, with what the plan checks of it, in
rlbuild/contracts/recipe.py `SANDBOX_PROVIDERS`; tests/trainer/test_sandbox_registry.py holds the two to the same
names."""

from __future__ import annotations

import shutil
from collections.abc import Mapping

from rlbuild.contracts.recipe import SandboxSection
from trainer.sandbox import SandboxError, harbor, local, write_files
from trainer.sandbox.base import Provider, Reusable
from trainer.sandbox.local.reachable import make_folder

PROVIDERS: dict[str, Provider] = {provider.name: provider for provider in (local.PROVIDER, *harbor.PROVIDERS)}


def provider_for(spec: SandboxSection) -> Provider:
    """The provider of the spec's backend."""
    found = PROVIDERS.get(spec.backend)
    if found is None:
        raise SandboxError(
            f"environment.sandbox.backend {spec.backend!r} has no provider in this trainer; it knows "
            f"{', '.join(map(repr, PROVIDERS))}: re-resolve the launch with a backend of this checkout"
        )
    return found


def open_sandbox(spec: SandboxSection, files: Mapping[str, str | bytes]) -> Reusable:
    """A started sandbox whose working folder holds `files` (paths relative to it); the provider's sandbox owns the
    folder from then on and removes it on close."""
    provider = provider_for(spec)
    folder = make_folder("rlbuild-sandbox-")
    try:
        write_files(folder, files)
        return provider.start(spec, folder)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise


def prove(spec: SandboxSection) -> None:
    """Before a run builds anything, start one sandbox of the node's own backend (`local`) exactly as the episodes'
    will start (same user, binary, folders and limits) and run one command in it: a node where none can start is
    refused with the cause, instead of training on episodes that all failed to start (a remote provider's first
    sandbox is an episode's)."""
    if spec.backend != local.PROVIDER.name:
        return
    try:
        with open_sandbox(spec, {}) as sandbox:
            result = sandbox.run("true")
    except SandboxError as error:
        raise SandboxError(f"no local sandbox can start on this node, so no episode could: {error}") from None
    if result.exit_code != 0:
        raise SandboxError(
            f"a local sandbox started, but `true` in it {result.note or f'exited {result.exit_code}'}: "
            f"{result.output[-500:]!r}; the episodes' commands would fail the same way. Check the node's bubblewrap "
            "and the sandbox's limits (environment.sandbox)"
        )
