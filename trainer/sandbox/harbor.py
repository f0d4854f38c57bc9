"""A Harbor task's sandbox: Harbor's own task loader, environment and verifier, for any backend the recipe names.

`environment.sandbox.backend` picks the environment: `local` is rlbuild's bubblewrap sandbox plugged into Harbor
as its environment class (trainer/sandbox/harbor_local.py); daytona, modal, e2b and docker are Harbor's
environments of that type, started from the node the episode runs on with the credentials the job was given
(rlbuild/core/wire.py forwards the provider's variables by name; AWS_*/R2_* never reach a job). An episode runs
its commands with `run`, is scored once with `verify` (the task's tests/test.sh writes the reward), and `close`
stops and deletes the sandbox.

Harbor is asynchronous; each call runs to its end, so the episode player's threads use a sandbox like the local
one. A local sandbox keeps an event loop of its own (its commands block the loop they run on, and episodes run side
by side). A provider's sandboxes share one loop, on a thread of its own: Harbor's client for a provider is one per
process (Daytona's DaytonaClientManager), bound to the loop it was made on, so a second loop could not use it.
Harbor is imported here only: a run without Harbor tasks never loads it (it is the `harbor` extra).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from rlbuild.contracts.recipe import SANDBOX_PROVIDERS, SandboxSection
from trainer.sandbox import ClosedOnExit, CommandResult, SandboxError, SandboxTimings

_shared_loop: asyncio.AbstractEventLoop | None = None
_shared_loop_lock = threading.Lock()


def _shared_event_loop() -> asyncio.AbstractEventLoop:
    """The process's loop for providers' sandboxes, started on its own thread at first use."""
    global _shared_loop
    with _shared_loop_lock:
        if _shared_loop is None:
            _shared_loop = asyncio.new_event_loop()
            threading.Thread(target=_shared_loop.run_forever, name="harbor-providers", daemon=True).start()
        return _shared_loop


def _harbor() -> Any:
    try:
        import harbor.environments.factory as factory
        import harbor.models.task.task as task
        import harbor.models.trial.paths as paths
        import harbor.verifier.verifier as verifier
    except ImportError as error:
        raise SandboxError(
            f"Harbor tasks need the `harbor` extra on the node ({error}); install it with "
            "`scripts/setup.sh --extra harbor` (rlbuild check says which runtime the nodes use)"
        ) from None
    return factory, task, paths, verifier


class HarborSandbox(ClosedOnExit):
    """One episode of one Harbor task, in the recipe's sandbox backend."""

    def __init__(self, spec: SandboxSection, task_dir: Path) -> None:
        began = time.monotonic()
        factory, task_module, paths, verifier = _harbor()
        self.spec = spec
        self.timings = SandboxTimings()
        self.ended = False
        self._verifier_class = verifier.Verifier
        self._shared = SANDBOX_PROVIDERS[spec.backend].harbor_type is not None
        self._loop = _shared_event_loop() if self._shared else asyncio.new_event_loop()
        self._trial = Path(tempfile.mkdtemp(prefix="rlbuild-harbor-"))
        self._trial.chmod(0o711)  # a root trainer's sandbox runs as another user, who must reach its folders
        try:
            self.task = task_module.Task(task_dir)
            self.trial_paths = paths.TrialPaths(trial_dir=self._trial)
            self.trial_paths.mkdir()
            self.environment = self._environment(factory)
            self._call(self.environment.start(force_build=False))
            # Harbor's trials have the environment make its log folders at start (the mounts they pass); a
            # provider's sandbox gets them nowhere else, and the verifier writes its reward in one.
            places = paths.EnvironmentPaths.for_os(self.environment.os)
            self._call(self.environment.ensure_dirs([places.agent_dir, places.verifier_dir, places.artifacts_dir]))
        except BaseException:
            self.close()
            raise
        self.timings.start_s = time.monotonic() - began

    def _environment(self, factory: Any) -> Any:
        """Harbor's environment of the backend's type, built as Harbor's own trials build one."""
        keywords: dict[str, Any] = {
            "environment_dir": self.task.paths.environment_dir,
            "environment_name": self.task.short_name,
            "session_id": f"{self.task.short_name}__{uuid.uuid4().hex[:8]}__env",
            "trial_paths": self.trial_paths,
            "task_env_config": self.task.config.environment,
        }
        harbor_type = SANDBOX_PROVIDERS[self.spec.backend].harbor_type
        if harbor_type is None:
            from trainer.sandbox.harbor_local import BubblewrapEnvironment

            return BubblewrapEnvironment(**keywords, sandbox_spec=self.spec)
        return factory.EnvironmentFactory.create_environment(factory.EnvironmentType(harbor_type), **keywords)

    def _call[T](self, work: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        if self._shared:
            return asyncio.run_coroutine_threadsafe(asyncio.wait_for(work, timeout_s), self._loop).result()
        return self._loop.run_until_complete(asyncio.wait_for(work, timeout_s))

    def run(self, command: str) -> CommandResult:
        """Run one of the agent's commands; past the episode's sandbox time, nothing runs and the episode ends."""
        left = self.spec.episode_timeout_s - self.timings.command_s
        if self.ended or left <= 0:
            self.ended = True
            return CommandResult("", None, 0.0, f"the episode's {self.spec.episode_timeout_s:g} s are used up", True)
        began = time.monotonic()
        limit = min(self.spec.command_timeout_s, left)
        try:
            result = self._call(self.environment.exec(command, timeout_sec=max(1, int(limit))), limit + 5)
        except TimeoutError:
            return self._count(CommandResult("", None, time.monotonic() - began, f"past its {limit:g} s limit", True))
        output = (result.stdout or "") + (result.stderr or "")
        cut = output.encode()[: self.spec.max_output_bytes].decode(errors="ignore")
        return self._count(CommandResult(cut, result.return_code, time.monotonic() - began))

    def _count(self, result: CommandResult) -> CommandResult:
        self.timings.commands += 1
        self.timings.command_s += result.seconds
        self.ended = self.ended or result.ended
        return result

    def verify(self) -> float:
        """The task's verifier, as Harbor runs it after an agent: its `reward` (or its only value)."""
        verifier = self._verifier_class(task=self.task, trial_paths=self.trial_paths, environment=self.environment)
        rewards = self._call(verifier.verify(), self.task.config.verifier.timeout_sec).rewards or {}
        if "reward" in rewards:
            return float(rewards["reward"])
        if len(rewards) == 1:
            return float(next(iter(rewards.values())))
        raise SandboxError(f"task {self.task.short_name!r}: the verifier wrote {sorted(rewards)}, not one reward")

    def close(self) -> None:
        """Stop and delete the sandbox (a provider's too); again is a no-op."""
        self.ended = True
        environment = getattr(self, "environment", None)
        try:
            if environment is not None and not self._loop.is_closed():
                self._call(environment.stop(delete=True), 60)
        finally:
            self.environment = None
            if not self._shared and not self._loop.is_closed():
                self._loop.close()
            shutil.rmtree(self._trial, ignore_errors=True)


def open_task_sandbox(spec: SandboxSection, task_dir: Path) -> HarborSandbox:
    """A started sandbox for the Harbor task in `task_dir`, in `spec.backend`."""
    return HarborSandbox(spec, task_dir)
