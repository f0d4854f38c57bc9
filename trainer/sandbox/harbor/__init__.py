"""Harbor's own environments as providers: one per backend whose declaration (rlbuild/contracts/recipe.py
`SANDBOX_PROVIDERS`) names a Harbor environment type, started from the node the episode runs on with the
credentials the job was given (rlbuild/core/wire.py forwards the provider's variables by name; AWS_*/R2_* never
reach a job).

A provider's sandboxes share one event loop, on a thread of its own: Harbor's client for a provider is one per
process (Daytona's DaytonaClientManager), bound to the loop it was made on, so a second loop could not use it.
Harbor is imported only when a task's environment is made (it is the `harbor` extra).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from rlbuild.contracts.recipe import SANDBOX_PROVIDERS, SandboxSection
from trainer.sandbox.base import Provider, harbor_module

_shared_loop: asyncio.AbstractEventLoop | None = None
_shared_loop_lock = threading.Lock()


class HarborProvider(Provider):
    """The backend `name`, run by Harbor's environment of `harbor_type`."""

    def __init__(self, name: str, harbor_type: str) -> None:
        super().__init__(name)
        self.harbor_type = harbor_type

    def task_environment(self, spec: SandboxSection, keywords: dict[str, Any]) -> Any:
        factory = harbor_module("harbor.environments.factory")
        return factory.EnvironmentFactory.create_environment(factory.EnvironmentType(self.harbor_type), **keywords)

    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The process's loop for providers' sandboxes, started on its own thread at first use."""
        global _shared_loop
        with _shared_loop_lock:
            if _shared_loop is None:
                _shared_loop = asyncio.new_event_loop()
                threading.Thread(target=_shared_loop.run_forever, name="harbor-providers", daemon=True).start()
            return _shared_loop


PROVIDERS = tuple(
    HarborProvider(name, declared.harbor_type)
    for name, declared in SANDBOX_PROVIDERS.items()
    if declared.harbor_type is not None
)
