"""The gang's rendezvous folder in artifact storage (a local folder or s3://), one per job and attempt.

Layout under `<root>/<job>/<gang id>/attempt-<n>/`:
  head.json         rank 0's Ray address, written once Ray's head is up
  alive/<rank>      a rank has joined Ray: the time, rewritten while its Ray node runs (a heartbeat)
  inputs/<rank>     a worker rank materialised its inputs
  done              rank 0's job step succeeded: workers exit 0
  failed            rank 0's job step failed (the text says how): workers exit non-zero

`<job>`, `<n>` and the rank are the task's, as its scheduler tells it (`Scheduler.task`: the job's name or id, and
its attempt: a restart of the gang, or the link of a requeued job), and `<gang id>` is fixed at submission (a
re-used job name never sees an older submission's files): a restarted gang rendezvouses in a fresh folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError

OUTCOME_POLL_MAX_S = 5.0  # what a worker adds, at most, to the end of its gang's job


class GangTaskError(RlbuildError):
    """This process cannot take its part in a gang: its environment does not say which task of which scheduler job
    it is, or it found no ports to offer its peers."""


@dataclass(frozen=True)
class TaskIdentity:
    """Which task of the gang this process is: its job, its rank, and the job's attempt (a fresh rendezvous each)."""

    job: str
    rank: int
    attempt: int
    scheduler: str


class RendezvousError(RlbuildError):
    """The gang could not assemble: a rank did not arrive in time, or rank 0 reported a failure."""


class Rendezvous:
    """One attempt's rendezvous folder. Every write is a whole small object (atomic on S3 and locally)."""

    def __init__(self, root: str, job: str, gang_id: str, attempt: int, poll_s: float = 0.5) -> None:
        self.job_root = storage.join(root, _safe(job))
        self.gang_root = storage.join(self.job_root, _safe(gang_id))
        self.uri = storage.join(self.gang_root, f"attempt-{attempt}")
        self.poll_s = poll_s

    def clear_stale(self) -> list[str]:
        """Rank 0: remove every earlier submission's and attempt's folder of this job; keep this attempt's."""
        removed = []
        for gang in storage.list_names(self.job_root):
            gang_uri = storage.join(self.job_root, gang)
            if gang_uri != self.gang_root:
                stale = [gang_uri]
            else:
                stale = [storage.join(gang_uri, a) for a in storage.list_names(gang_uri)]
                stale = [uri for uri in stale if uri != self.uri]
            for uri in stale:
                storage.remove(uri)
                removed.append(uri)
        return removed

    def publish_head(self, address: str, **extra: Any) -> None:
        self._write("head.json", json.dumps({"address": address, **extra}))

    def wait_head(self, timeout_s: float) -> dict[str, Any]:
        text = self._wait_for("head.json", timeout_s, "rank 0 to publish the Ray head address")
        return json.loads(text)

    def mark_alive(self, rank: int) -> None:
        self._write(f"alive/{rank}", str(time.time()))

    def alive_ranks(self) -> set[int]:
        return set(self._ranks("alive"))

    def heartbeats(self) -> dict[int, float]:
        """Each rank's last alive time (epoch seconds), for `rlbuild status`."""
        beats = {}
        for rank in self._ranks("alive"):
            text = self._read(f"alive/{rank}") or ""
            beats[rank] = float(text) if text.replace(".", "", 1).isdigit() else 0.0
        return beats

    def mark_inputs(self, rank: int) -> None:
        self._write(f"inputs/{rank}", str(time.time()))

    def ranks_with_inputs(self) -> set[int]:
        return set(self._ranks("inputs"))

    def head(self) -> dict[str, Any] | None:
        text = self._read("head.json")
        return None if text is None else json.loads(text)

    def _ranks(self, folder: str) -> list[int]:
        return [int(name) for name in storage.list_names(storage.join(self.uri, folder)) if name.isdigit()]

    def mark_done(self) -> None:
        self._write("done", str(time.time()))

    def mark_failed(self, reason: str) -> None:
        self._write("failed", reason)

    def outcome(self) -> tuple[bool, str] | None:
        """(True, "") once rank 0 succeeded, (False, reason) once it failed, None while it runs."""
        if storage.exists(storage.join(self.uri, "done")):
            return True, ""
        failed = self._read("failed")
        return None if failed is None else (False, failed)

    def wait_outcome(self, still_running: Callable[[], bool]) -> tuple[bool, str]:
        """Wait for rank 0's outcome while `still_running()` holds (this node's Ray is up), asked every poll.
        The outcome is read every poll at first, then ever less often, up to every OUTCOME_POLL_MAX_S: a worker
        waits a whole training for it, and each read is two storage requests (on S3, a fifth of a core at one
        poll a second)."""
        between, next_read = self.poll_s, 0.0
        while True:
            if time.monotonic() >= next_read:
                outcome = self.outcome()
                if outcome is not None:
                    return outcome
                next_read = time.monotonic() + between
                between = min(between * 2, OUTCOME_POLL_MAX_S)
            if not still_running():
                # Rank 0's success stops its head, and this node with it: the outcome says which it was.
                return self.outcome() or (
                    False,
                    "this node's Ray process exited before rank 0 finished (the head is gone?)",
                )
            time.sleep(self.poll_s)

    def _wait_for(self, name: str, timeout_s: float, what: str) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            text = self._read(name)
            if text is not None:
                return text
            if time.monotonic() > deadline:
                raise RendezvousError(f"timed out after {timeout_s:.0f}s waiting for {what} at {self.uri}/{name}")
            time.sleep(self.poll_s)

    def _write(self, name: str, text: str) -> None:
        storage.write_text(storage.join(self.uri, name), text)

    def _read(self, name: str) -> str | None:
        return storage.read_text(storage.join(self.uri, name))


def _safe(part: str) -> str:
    """A path component from a job name or id (a scheduler's job names may hold `/`: `/user/job`)."""
    return part.strip("/").replace("/", ".") or "_"
