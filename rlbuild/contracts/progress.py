"""What a running job publishes so `rlbuild status` can judge it from storage alone (no shell on a node).

    <attempts_root>/progress.json          the trainer: {step, max_steps, time, phase, host, pid, attempt_started}
    <rendezvous attempt>/alive/<rank>      each gang rank: the time, rewritten every HEARTBEAT_S while its Ray runs
    <rendezvous attempt>/inputs/<rank>     a gang worker materialised its inputs (rlbuild/job/rendezvous.py)

The trainer rewrites `progress.json` (one small object) after a step at most every MIN_INTERVAL_S seconds, and
always at a checkpoint and at the start of an attempt, so a run of half-second steps does not write twice a
second while a stalled run is seen within MIN_INTERVAL_S of its last step. A stalled trainer (paused, hung in a
collective) simply stops rewriting it: status reports the minutes since its `time`.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from rlbuild.core import storage
from rlbuild.core.storage import StorageError

PROGRESS = "progress.json"
MIN_INTERVAL_S = 5.0
HEARTBEAT_S = 15.0  # a gang rank's alive marker; three missed ones mark its node as gone


def progress_uri(attempts_root: str) -> str:
    return storage.join(attempts_root, PROGRESS)


def read_progress(attempts_root: str) -> dict[str, Any] | None:
    found = storage.read_json(progress_uri(attempts_root))
    return found if isinstance(found, dict) else None


class Progress:
    """The trainer's side: `started` once the attempt has its inputs and roles, `step` after every step."""

    def __init__(self, attempts_root: str, max_steps: int, min_interval_s: float = MIN_INTERVAL_S) -> None:
        self.uri, self.max_steps, self.min_interval_s = progress_uri(attempts_root), max_steps, min_interval_s
        self.attempt_started = time.time()
        self.last_write = 0.0

    def started(self, step: int) -> None:
        self._write(step, "training")

    def step(self, step: int, force: bool = False) -> None:
        if force or step >= self.max_steps or time.monotonic() - self.last_write >= self.min_interval_s:
            self._write(step, "training" if step < self.max_steps else "finished")

    def _write(self, step: int, phase: str) -> None:
        self.last_write = time.monotonic()
        document: dict[str, Any] = {
            "step": step,
            "max_steps": self.max_steps,
            "time": time.time(),
            "phase": phase,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "attempt_started": self.attempt_started,
        }
        try:
            storage.write_json(self.uri, document)
        except (OSError, StorageError) as error:  # progress is advisory: a storage hiccup must never stop training
            print(f"[trainer] could not publish progress to {self.uri}: {error}", flush=True)
