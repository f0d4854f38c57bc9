"""What an interrupt or a kill does to a local run: jobs stop cleanly, and no process outlives its run.

- Snakemake (the main process, in `onstart`): SIGINT (Ctrl-C, or `kill -INT <pid>` from a supervisor) is first
  passed on as SIGTERM to the `rlbuild` job commands it is running; then Snakemake handles it as it always does
  (it waits for its jobs, marks them incomplete and removes their partial outputs). Without this, an interrupt
  that reaches only Snakemake lets a training run on to its last step, and Snakemake then deletes it.
- A job command (`python -m rlbuild <stage>`) turns SIGTERM and SIGINT into `Interrupted`, so the children it
  runs are stopped with it and it exits INTERRUPTED_EXIT_CODE; `rlbuild train` instead passes the interrupt on
  to the trainer, which checkpoints the step under way and exits (trainer/continuation.py). When the Snakemake
  process that started a job dies (SIGKILL), the job interrupts itself rather than run on as an orphan.
- Children of job commands run in a session of their own (a terminal's Ctrl-C reaches them once, passed on,
  not also directly; their Ray processes never see it) and die with their parent (PR_SET_PDEATHSIG), so a
  killed job takes its trainer, and the trainer's local Ray, with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import psutil

from rlbuild.core.errors import RlbuildError
from rlbuild.core.wire import INTERRUPTED_EXIT_CODE

SNAKEMAKE_POLL_S = 1.0
_PR_SET_PDEATHSIG = 1
Handler = Callable[[int, FrameType | None], Any] | int | None


class Interrupted(RlbuildError):
    """The job was asked to stop (SIGTERM or SIGINT), or the Snakemake process that started it died."""


def _is_rlbuild_job(process: psutil.Process) -> bool:
    try:
        argv = process.cmdline()
    except psutil.Error:
        return False
    return any(a == "-m" and b == "rlbuild" for a, b in itertools.pairwise(argv))


def _is_snakemake(process: psutil.Process) -> bool:
    try:
        argv = process.cmdline()
    except psutil.Error:
        return False
    return any(os.path.basename(word) == "snakemake" for word in argv[:3])


def forward_to_jobs() -> None:
    """In Snakemake's main process: on SIGINT, send SIGTERM to every `rlbuild` job command, then let
    Snakemake's own handling follow."""
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: FrameType | None) -> None:
        for process in psutil.Process().children(recursive=True):
            if _is_rlbuild_job(process):
                with contextlib.suppress(psutil.Error):  # it ended meanwhile
                    process.send_signal(signal.SIGTERM)
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)


def raise_on_signals() -> None:
    """In a job command: SIGTERM and SIGINT raise Interrupted wherever the job is."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}")

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def stop_when_snakemake_dies(poll_s: float = SNAKEMAKE_POLL_S) -> None:
    """In a job command started by a local Snakemake: SIGTERM ourselves when that Snakemake process is gone."""
    try:
        watched = next((p for p in psutil.Process().parents() if _is_snakemake(p)), None)
    except psutil.Error:
        watched = None
    if watched is None:  # a job on a cluster node: its scheduler, not a local Snakemake, owns it
        return

    def watch() -> None:
        while watched.is_running() and watched.status() != psutil.STATUS_ZOMBIE:
            time.sleep(poll_s)
        os.write(2, f"[rlbuild] Snakemake (pid {watched.pid}) is gone: stopping this job\n".encode())
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="rlbuild-snakemake-watch", daemon=True).start()


def die_with(parent: int) -> Callable[[], None]:
    """A child's pre-exec step: SIGKILL it when `parent` (the pid that starts it) dies. Linux only."""

    def preexec() -> None:
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(INTERRUPTED_EXIT_CODE)

    return preexec


def start_child(argv: Sequence[str], **options: Any) -> subprocess.Popen[str]:
    """A child in a session of its own that dies with this process."""
    return subprocess.Popen(list(argv), start_new_session=True, preexec_fn=die_with(os.getpid()), **options)


def run_child(argv: Sequence[str]) -> int:
    """Run a child to its end; an Interrupted raised here stops it (SIGTERM, then SIGKILL) before propagating."""
    child = start_child(argv, text=True)
    try:
        return child.wait()
    except BaseException:
        stop(child)
        raise


def stop(child: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """SIGTERM, `grace_s` to exit, then SIGKILL."""
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(grace_s)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


class Forwarder:
    """Passes SIGTERM/SIGINT on to `child` as SIGTERM, once per request: the same Ctrl-C often arrives twice
    (from the terminal and from Snakemake's forwarding), and a second request within `dedupe_s` is that one."""

    def __init__(self, child: subprocess.Popen[str], dedupe_s: float = 2.0) -> None:
        self.child, self.dedupe_s = child, dedupe_s
        self.last = -float("inf")
        self.previous: dict[int, Handler] = {}

    def __enter__(self) -> Forwarder:
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self._forward)
        return self

    def _forward(self, _signum: int, _frame: FrameType | None) -> None:
        now = time.monotonic()
        if now - self.last >= self.dedupe_s and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)
        self.last = now

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
