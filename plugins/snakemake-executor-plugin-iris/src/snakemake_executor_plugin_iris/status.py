"""Honest status mapping: succeeded is success, every other terminal state is a failure."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from iris.client import JobState


class Outcome(Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


def outcome(state: JobState | str) -> Outcome:
    """SUCCEEDED only for `succeeded`; any other terminal state (failed, killed, worker_failed, unschedulable,
    or one a later Iris adds) is FAILED; everything else is still RUNNING."""
    from iris.client import JobState
    from iris.resources.state import is_job_finished

    if isinstance(state, str):  # the wire name, as GetJobState's JSON answers (`running`)
        try:
            state = JobState(state)
        except ValueError:  # a state this client does not know yet: not running, not succeeded
            return Outcome.FAILED
    if state is JobState.SUCCEEDED:
        return Outcome.SUCCEEDED
    if is_job_finished(state):
        return Outcome.FAILED
    return Outcome.RUNNING
