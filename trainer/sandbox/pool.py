"""A warm pool of sandboxes: an episode's sandbox, once the episode is done with it, is reset and lent to a later
episode instead of being killed, since starting a sandbox (processes and namespaces) costs more than the commands
of a short episode.

An episode gets its sandbox with `acquire(files)` and gives it back with the sandbox's `close()`: the pool resets it
then, in its own threads (so a finished episode's leftover processes stop at once, not when the sandbox is next
lent, and the reset overlaps what the caller does next: for a trainer, the policy's update), and keeps it, unless
the episode ended it (a time limit, the shell's exit) or the reset failed, which closes it for good. `acquire` takes
an idle sandbox, else waits for a reset under way (sooner than a new sandbox), else starts one. What a reset
guarantees is the provider's (trainer/sandbox/local/bubblewrap.py): every process gone, the writable places empty,
a fresh shell; a sandbox whose reset did not complete is never lent again.

Sandboxes are started in the threads that call `acquire` and live as long as the thread that started them (bwrap's
--die-with-parent), so call it from threads that outlive the pool: an episode player's worker threads.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

from rlbuild.contracts.recipe import SandboxSection
from trainer.sandbox import ClosedOnExit, CommandResult, Sandbox, SandboxError, SandboxTimings
from trainer.sandbox.base import Reusable
from trainer.sandbox.registry import open_sandbox

# Resets at once: each mostly waits on the sandbox's processes (kill, reap, exec), so a few threads overlap them.
RESETTERS = 4


class SandboxPool(ClosedOnExit):
    """Sandboxes of one spec, lent one episode at a time. `size` bounds the sandboxes kept (idle or being reset);
    None keeps every one given back, at most as many as were ever lent at once."""

    def __init__(self, spec: SandboxSection, size: int | None = None) -> None:
        self.spec = spec
        self.size = size
        self.started = 0  # sandboxes started: the first lent, and each after a failed reset or an ended episode
        self.reused = 0  # sandboxes lent again after a reset
        self._idle: list[Reusable] = []
        self._resetting = 0
        self._alive: set[Reusable] = set()  # idle, being reset and lent: what close() kills
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a reset ended, or the pool closed
        self._resets = ThreadPoolExecutor(RESETTERS, thread_name_prefix="sandbox-reset")
        self._closed = False

    def acquire(self, files: Mapping[str, str | bytes]) -> Sandbox:
        """A sandbox holding `files` in its working folder: a reset one if one is idle or soon will be, else a new
        one."""
        with self._changed:
            while not self._closed and not self._idle and self._resetting:
                self._changed.wait()
            if self._closed:
                raise SandboxError("the sandbox pool was closed; acquire sandboxes before closing its player")
            idle = self._idle.pop() if self._idle else None
        if idle is None:
            sandbox = open_sandbox(self.spec, files)
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
        """Have a sandbox an episode is done with reset and kept idle, in the pool's threads; or close it for good
        now: the episode ended it, the pool is full or closed."""
        with self._lock:
            kept = len(self._idle) + self._resetting
            keep = not self._closed and not sandbox.ended and (self.size is None or kept < self.size)
            self._resetting += keep
        if keep:
            try:
                self._resets.submit(self._reset, sandbox)
                return
            except RuntimeError:  # closed since: its threads take no more work
                with self._changed:
                    self._resetting -= 1
                    self._changed.notify_all()
        self._forget(sandbox)

    def close(self) -> None:
        """Kill every sandbox of the pool, idle, being reset or lent (a lent one's next command says it was
        stopped), and wait for the resets under way to give up."""
        with self._changed:
            self._closed = True
            alive, self._alive, self._idle = self._alive, set(), []
            self._changed.notify_all()
        for sandbox in alive:
            sandbox.close()
        self._resets.shutdown(wait=True)

    def _reset(self, sandbox: Reusable) -> None:
        reset = False
        try:
            sandbox.reset()
            reset = True
        except SandboxError:
            pass  # the reset closed it; the next acquire starts a fresh one
        finally:  # whatever the reset raised, a waiting acquire hears of it, after a failed sandbox is gone
            if not reset:
                sandbox.close()
            with self._changed:
                self._resetting -= 1
                kept = reset and not sandbox.ended and not self._closed
                if kept:
                    self._idle.append(sandbox)
                else:
                    self._alive.discard(sandbox)
                # Every waiter looks again: one woken alone by a failed reset would wait on, and if that was the
                # last reset under way, the others would never hear that they should start sandboxes of their own.
                self._changed.notify_all()
            if not kept:
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
