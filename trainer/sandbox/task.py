"""A Harbor task's sandbox: Harbor's own task loader, environment and verifier, on any provider.

The recipe's provider (trainer/sandbox/registry.py) makes Harbor's environment for the task: rlbuild's bubblewrap
sandbox as a Harbor environment class (trainer/sandbox/local/), or Harbor's environment of a provider's type
(trainer/sandbox/harbor/). An episode runs its commands with `run`, is scored once with `verify` (the task's
tests/test.sh writes the reward), and `close` stops and deletes the sandbox.

Harbor is asynchronous; each call runs to its end, so the episode player's threads use a sandbox like the local
one. A sandbox keeps an event loop of its own (a local one's commands block the loop they run on, and episodes
run side by side) unless its provider runs all its sandboxes on one loop (`Provider.event_loop`). Harbor is
imported here only when a task's sandbox opens: a run without Harbor tasks never loads it (it is the `harbor`
extra).
"""

from __future__ import annotations

import asyncio
import shutil
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from rlbuild.contracts.recipe import SandboxSection
from trainer.sandbox import ClosedOnExit, CommandResult, SandboxError, SandboxTimings
from trainer.sandbox.base import harbor_module
from trainer.sandbox.local.reachable import make_folder
from trainer.sandbox.registry import provider_for


class HarborSandbox(ClosedOnExit):
    """One episode of one Harbor task, in the recipe's sandbox backend."""

    def __init__(self, spec: SandboxSection, task_dir: Path) -> None:
        began = time.monotonic()
        task_module, paths = harbor_module("harbor.models.task.task"), harbor_module("harbor.models.trial.paths")
        self.spec = spec
        self.timings = SandboxTimings()
        self.ended = False
        self._verifier_class = harbor_module("harbor.verifier.verifier").Verifier
        self._provider = provider_for(spec)
        shared = self._provider.event_loop()
        self._shared = shared is not None
        self._loop = shared or asyncio.new_event_loop()
        self._trial = make_folder("rlbuild-harbor-")
        self._trial.chmod(0o711)  # a root trainer's sandbox runs as another user, who must reach its folders
        try:
            self.task = task_module.Task(task_dir)
            self.trial_paths = paths.TrialPaths(trial_dir=self._trial)
            self.trial_paths.mkdir()
            self.environment = self._environment()
            self._call(self.environment.start(force_build=False))
            # Harbor's trials have the environment make its log folders at start (the mounts they pass); a
            # provider's sandbox gets them nowhere else, and the verifier writes its reward in one.
            places = paths.EnvironmentPaths.for_os(self.environment.os)
            self._call(self.environment.ensure_dirs([places.agent_dir, places.verifier_dir, places.artifacts_dir]))
        except BaseException:
            self.close()
            raise
        self.timings.start_s = time.monotonic() - began

    def _environment(self) -> Any:
        """Harbor's environment of the provider, built as Harbor's own trials build one."""
        keywords: dict[str, Any] = {
            "environment_dir": self.task.paths.environment_dir,
            "environment_name": self.task.short_name,
            "session_id": f"{self.task.short_name}__{uuid.uuid4().hex[:8]}__env",
            "trial_paths": self.trial_paths,
            "task_env_config": self.task.config.environment,
        }
        return self._provider.task_environment(self.spec, keywords)

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
        try:
            rewards = self._call(verifier.verify(), self.task.config.verifier.timeout_sec).rewards or {}
        except SandboxError:
            raise
        except Exception as error:
            # Harbor's errors say which step failed and keep why in their cause (a link the sandbox left where the
            # host copies results from, say): the episode's error carries both.
            if error.__cause__ is None:
                raise
            cause = f"{type(error.__cause__).__name__}: {error.__cause__}"
            raise SandboxError(f"task {self.task.short_name!r}: {error} ({cause})") from error
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
