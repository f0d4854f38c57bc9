"""What a running job publishes so `rlbuild status` can judge it from storage alone (no shell on a node).

    <attempts_root>/progress.json          the trainer: {step, max_steps, time, phase, host, pid, attempt_started,
                                           episodes (agent runs)}
    <rendezvous attempt>/alive/<rank>      each gang rank: the time, rewritten every HEARTBEAT_S while its Ray runs
    <rendezvous attempt>/inputs/<rank>     a gang worker materialised its inputs (rlbuild/job/rendezvous.py)

The trainer rewrites `progress.json` (one small object) after a step at most every MIN_INTERVAL_S seconds, and
always at a checkpoint and at the start of an attempt, so a run of half-second steps does not write twice a
second while a stalled run is seen within MIN_INTERVAL_S of its last step. A stalled trainer (paused, hung in a
collective) simply stops rewriting it: status reports the minutes since its `time`.

An agent run's trainer also publishes its episodes while a step plays (`episodes`: trainer/agents/episodes.py
`Liveness`), since a step whose sandboxes stop answering never ends and so never writes a step:

    {"playing": bool, "since": epoch the batches in play began, "finished": episodes finished since,
     "errors": {kind: episodes failed since}, "last_finished": epoch an episode last finished (this attempt)}

rewritten when a batch begins and ends, and as episodes end at most every MIN_INTERVAL_S seconds. Status reads
`playing` with `last_finished` (or `since`) against its own clock: no episode finished in
`execution.episode_stall_after_s` is a starving run (rlbuild/ops/status.py).
"""

from __future__ import annotations

import os
import socket
import threading
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
        self.playing: dict[str, Any] | None = None  # the episodes' liveness, in every write once published
        # The last step (written or not yet, within the interval): an episodes' rewrite carries it, and its `time`
        # says when that step ended, not when the episodes were written.
        self._step, self._phase, self._stepped = 0, "training", time.time()
        self._lock = threading.Lock()  # episodes are published from fully_async's generator thread too

    def started(self, step: int) -> None:
        self._stepped_to(step, "training")
        self._write()

    def step(self, step: int, force: bool = False) -> None:
        self._stepped_to(step, "training" if step < self.max_steps else "finished")
        if force or step >= self.max_steps or self._due():
            self._write()

    def episodes(self, state: dict[str, Any], force: bool) -> None:
        """The episodes in play (`force`: a batch began or ended, which status must see), beside the last step."""
        with self._lock:
            self.playing = state
        if force or self._due():
            self._write()

    def _stepped_to(self, step: int, phase: str) -> None:
        with self._lock:
            self._step, self._phase, self._stepped = step, phase, time.time()

    def _due(self) -> bool:
        return time.monotonic() - self.last_write >= self.min_interval_s

    def _write(self) -> None:
        with self._lock:  # one document at a time: the step's and the episodes' writers never interleave
            self.last_write = time.monotonic()
            document: dict[str, Any] = {
                "step": self._step,
                "max_steps": self.max_steps,
                "time": self._stepped,
                "phase": self._phase,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "attempt_started": self.attempt_started,
            }
            if self.playing is not None:
                document["episodes"] = self.playing
            self._store(document)

    def _store(self, document: dict[str, Any]) -> None:
        try:
            storage.write_json(self.uri, document)
        except (OSError, StorageError) as error:  # progress is advisory: a storage hiccup must never stop training
            print(f"[trainer] could not publish progress to {self.uri}: {error}", flush=True)
