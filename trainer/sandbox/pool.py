"""A warm pool of sandboxes: an episode's sandbox, once the episode is done with it, is reset and lent to a later
episode instead of being killed, since starting a sandbox (processes and namespaces) costs more than the commands
of a short episode.

An episode gets its sandbox with `acquire(files)` and gives it back with the sandbox's `close()`: the pool resets it
then (so a finished episode's leftover processes stop at once, not when the sandbox is next lent) and keeps it,
unless the episode ended it (a time limit, the shell's exit) or the reset failed, which closes it for good. What a
reset guarantees is the backend's (trainer/sandbox/local.py): every process gone, the writable places empty, a
fresh shell; a sandbox whose reset did not complete is never lent again.

Sandboxes are started in the threads that call `acquire` and live as long as the thread that started them (bwrap's
--die-with-parent), so call it from threads that outlive the pool: an episode player's worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Protocol, cast

from rlbuild.contracts.recipe import SandboxSection
from trainer.sandbox import ClosedOnExit, CommandResult, Sandbox, SandboxError, SandboxTimings, open_sandbox


class Reusable(Sandbox, Protocol):
    """A sandbox the pool can lend again: a backend's sandbox with a reset."""

    @property
    def ended(self) -> bool: ...

    def reset(self) -> None: ...

    def load(self, files: Mapping[str, str | bytes]) -> None: ...


class SandboxPool(ClosedOnExit):
    """Sandboxes of one spec, lent one episode at a time. `size` bounds the idle sandboxes kept; None keeps every
    one given back, at most as many as were ever lent at once."""

    def __init__(self, spec: SandboxSection, size: int | None = None) -> None:
        self.spec = spec
        self.size = size
        self.started = 0  # sandboxes started: the first lent, and each after a failed reset or an ended episode
        self.reused = 0  # sandboxes lent again after a reset
        self._idle: list[Reusable] = []
        self._alive: set[Reusable] = set()  # idle and lent: what close() kills
        self._lock = threading.Lock()
        self._closed = False

    def acquire(self, files: Mapping[str, str | bytes]) -> Sandbox:
        """A sandbox holding `files` in its working folder: a reset one if one is idle, else a new one."""
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox pool was closed; acquire sandboxes before closing its player")
            idle = self._idle.pop() if self._idle else None
        if idle is None:
            sandbox = cast(Reusable, open_sandbox(self.spec, files))  # every backend's sandbox has a reset
        else:
            try:
                idle.load(files)
            except BaseException:
                self._forget(idle)
                raise
            sandbox = idle
        with self._lock:
            self._alive.add(sandbox)
            self.started += idle is None
            self.reused += idle is not None
            if self._closed:  # closed meanwhile: kill it, as close() killed the rest
                sandbox.close()
        return _Lease(self, sandbox)

    def give_back(self, sandbox: Reusable) -> None:
        """Reset a sandbox an episode is done with and keep it idle, or close it for good: the episode ended it, the
        reset failed, the pool is full or closed."""
        with self._lock:
            keep = not self._closed and (self.size is None or len(self._idle) < self.size)
        if keep and not sandbox.ended:
            try:
                sandbox.reset()
            except SandboxError:
                keep = False  # the reset closed it; the next acquire starts a fresh one
        with self._lock:
            if keep and not sandbox.ended and not self._closed:
                self._idle.append(sandbox)
                return
        self._forget(sandbox)

    def close(self) -> None:
        """Kill every sandbox of the pool, idle or lent (a lent one's next command says it was stopped)."""
        with self._lock:
            self._closed = True
            alive, self._alive, self._idle = self._alive, set(), []
        for sandbox in alive:
            sandbox.close()

    def _forget(self, sandbox: Reusable) -> None:
        sandbox.close()
        with self._lock:
            self._alive.discard(sandbox)


class _Lease(ClosedOnExit):
    """One episode's hold on a pooled sandbox: closing it gives the sandbox back once, and a command after that is
    refused, so an episode that kept a reference cannot reach the next episode's sandbox."""

    def __init__(self, pool: SandboxPool, sandbox: Reusable) -> None:
        self.pool: SandboxPool | None = pool
        self.sandbox = sandbox
        self.timings: SandboxTimings = sandbox.timings  # the episode's own: a reset starts new ones

    def run(self, command: str) -> CommandResult:
        if self.pool is None:
            return CommandResult("", None, 0.0, "the episode gave its sandbox back; the command was not run", True)
        return self.sandbox.run(command)

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.give_back(self.sandbox)
