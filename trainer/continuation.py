"""'To be continued': stop at a step boundary before the job's wall-clock limit, checkpoint, and hand over.

A run on Slurm is a chain of jobs (rlbuild/chain.py). The trainer is asked to stop by Slurm's warning signal
(SIGUSR1, `--signal=USR1@<lead>`) or by the deadline the chain passes in RLBUILD_STOP_AT (the job's end less the
lead; Slurm's signal may come up to a minute late or, before the trainer listens, not at all). The loop asks
`requested()` once per step: the step under way finishes, a checkpoint of it is written, and the process exits
with CONTINUE_EXIT_CODE; the next link resumes from that checkpoint, so no step is trained twice.
"""

from __future__ import annotations

import os
import signal
import time

from rlbuild.chain import CONTINUE_EXIT_CODE, STOP_AT_ENV
from trainer.errors import TrainerError

__all__ = ["CONTINUE_EXIT_CODE", "ToBeContinued", "listen", "requested"]

_state: dict[str, float | None] = {"signalled_at": None, "deadline": None}


class ToBeContinued(TrainerError):
    """Training stopped at a checkpoint before the wall-clock limit; the next job of the chain resumes it."""

    def __init__(self, step: int, checkpoint: str, reason: str) -> None:
        self.step, self.checkpoint = step, checkpoint
        super().__init__(f"to be continued: {reason}; checkpoint of step {step} at {checkpoint}")


def listen() -> None:
    """Install the SIGUSR1 handler and read the deadline; call once, early, in the training process."""
    text = os.environ.get(STOP_AT_ENV, "")
    try:
        _state["deadline"] = float(text) if text else None
    except ValueError:
        raise TrainerError(f"{STOP_AT_ENV}={text!r} is not a time in seconds since the epoch") from None
    signal.signal(signal.SIGUSR1, _on_signal)


def requested() -> str | None:
    """Why training should stop after this step (the signal, or the deadline passing), else None."""
    signalled, deadline = _state["signalled_at"], _state["deadline"]
    if signalled is not None:
        return f"wall-clock warning (SIGUSR1) received at {time.strftime('%H:%M:%S', time.localtime(signalled))}"
    if deadline is not None and time.time() >= deadline:
        return f"hand-over time {time.strftime('%H:%M:%S', time.localtime(deadline))} reached"
    return None


def _on_signal(_signum: int, _frame: object) -> None:
    _state["signalled_at"] = _state["signalled_at"] or time.time()
