"""'To be continued': stop at a step boundary before the job's wall-clock limit, or when asked, checkpoint, and exit.

A run on a scheduler whose jobs end at a wall-clock limit is a chain of jobs (rlbuild/schedulers/). The trainer is
asked to stop by the scheduler's warning signal (SIGUSR1, `--signal=USR1@<lead>`) or by the deadline the chain
passes in RLBUILD_STOP_AT (the job's end less the lead; the signal may come up to a minute late or, before the
trainer listens, not at all). The loop asks
`requested()` once per step: the step under way finishes, a checkpoint of it is written, and the process exits
with CONTINUE_EXIT_CODE; the next link resumes from that checkpoint, so no step is trained twice.

An interrupt (SIGINT or SIGTERM: Ctrl-C passed on by `rlbuild train`, a scheduler cancelling the job) is a
request of the same kind: the step under way finishes, is checkpointed, and the trainer exits
INTERRUPTED_EXIT_CODE, so a rerun resumes where it stopped and an interrupt costs no finished step. A second
interrupt stops at once (the default action of the signal).
"""

from __future__ import annotations

import os
import signal
import time
from types import FrameType

from rlbuild.core.wire import CONTINUE_EXIT_CODE, INTERRUPTED_EXIT_CODE, STOP_AT_ENV
from trainer.errors import TrainerError

__all__ = ["CONTINUE_EXIT_CODE", "INTERRUPTED_EXIT_CODE", "ToBeContinued", "listen", "requested"]

_state: dict[str, float | None] = {"signalled_at": None, "deadline": None, "interrupted_at": None, "signal": None}


class ToBeContinued(TrainerError):
    """Training stopped at a checkpoint before the wall-clock limit, or on an interrupt; a later run resumes it."""

    def __init__(self, step: int, checkpoint: str, reason: str, exit_code: int = CONTINUE_EXIT_CODE) -> None:
        self.step, self.checkpoint, self.exit_code = step, checkpoint, exit_code
        what = "to be continued" if exit_code == CONTINUE_EXIT_CODE else "stopped"
        super().__init__(f"{what}: {reason}; checkpoint of step {step} at {checkpoint}")


def listen() -> None:
    """Install the SIGUSR1 handler and read the deadline; call once, early, in the training process."""
    text = os.environ.get(STOP_AT_ENV, "")
    try:
        _state["deadline"] = float(text) if text else None
    except ValueError:
        raise TrainerError(f"{STOP_AT_ENV}={text!r} is not a time in seconds since the epoch") from None
    signal.signal(signal.SIGUSR1, _on_signal)
    signal.signal(signal.SIGINT, _on_interrupt)
    signal.signal(signal.SIGTERM, _on_interrupt)


def finished() -> None:
    """The run is complete: a wall-clock warning that arrives now is moot. Ignored, not handled, because an
    interpreter shutting down restores the default action of a handled signal, and SIGUSR1's default kills."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)


def requested() -> tuple[str, int] | None:
    """Why training should stop after this step and the exit code that says so, else None."""
    signalled, deadline, interrupted = _state["signalled_at"], _state["deadline"], _state["interrupted_at"]
    if interrupted is not None:
        name = signal.Signals(int(_state["signal"] or signal.SIGTERM)).name
        return f"interrupted ({name} at {_clock(interrupted)}); run again to resume", INTERRUPTED_EXIT_CODE
    if signalled is not None:
        return f"wall-clock warning (SIGUSR1) received at {_clock(signalled)}", CONTINUE_EXIT_CODE
    if deadline is not None and time.time() >= deadline:
        return f"hand-over time {_clock(deadline)} reached", CONTINUE_EXIT_CODE
    return None


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(epoch))


def _on_signal(_signum: int, _frame: FrameType | None) -> None:
    _state["signalled_at"] = _state["signalled_at"] or time.time()


def _on_interrupt(signum: int, _frame: FrameType | None) -> None:
    if _state["interrupted_at"] is not None:  # asked twice: stop now, as the signal would without us
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _state["interrupted_at"], _state["signal"] = time.time(), signum
    # os.write, not print: a handler may run in the middle of a print to the same stream.
    os.write(2, f"[trainer] {signal.Signals(signum).name}: stopping after this step with a checkpoint\n".encode())
