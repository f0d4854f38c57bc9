"""What an interrupt or a kill does to a local run: jobs stop cleanly, and no process outlives its run.

- Snakemake (the main process, in `onstart`): SIGINT (Ctrl-C, or `kill -INT <pid>` from a supervisor) is first
  passed on as SIGTERM to the `rlbuild` job commands it is running; then Snakemake handles it as it always does
  (it waits for its jobs, marks them incomplete and removes their partial outputs). Without this, an interrupt
  that reaches only Snakemake lets a training run on to its last step, and Snakemake then deletes it.
- A job that exits INTERRUPTED_EXIT_CODE was stopped on request, not broken: Snakemake's error block for it (the
  CalledProcessError, `Error in rule`) is left out of its log (`QuietStoppedJobs`), and `onerror` ends the run
  with one line of ours (`stopped_line`: what stopped where, the last checkpoint, the command that resumes) and
  exit 130 instead of Snakemake's `WorkflowError` and exit 1.
- A job command (`python -m rlbuild <stage>`) turns SIGTERM and SIGINT into `Interrupted`, so the children it
  runs are stopped with it and it exits INTERRUPTED_EXIT_CODE; `rlbuild train` instead passes the interrupt on
  to the trainer, which checkpoints the step under way and exits (trainer/continuation.py). When the Snakemake
  process that started a job dies (SIGKILL), the job interrupts itself rather than run on as an orphan.
- Children of job commands run in a session of their own (a terminal's Ctrl-C reaches them once, passed on,
  not also directly; their Ray processes never see it) and die with their parent (PR_SET_PDEATHSIG), so a
  killed job takes its trainer, and the trainer's local Ray, with it.
- What a child leaves behind is its supervisor's to end (`supervised`): the supervisor adopts its child's orphans
  (PR_SET_CHILD_SUBREAPER), so when the trainer ends, however it ended (SIGKILL included), every process it
  started (its local Ray's services, agents and workers) is a descendant of the supervisor, which stops them by
  PID (never `ray stop`: other runs' Ray is not ours) and removes the Ray session folder it made for that run; a
  watchdog of its own session does the same, by that folder, when the supervisor is killed with its group.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import itertools
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import Any, NoReturn

import psutil

from rlbuild.core.errors import RlbuildError
from rlbuild.core.wire import INTERRUPTED_EXIT_CODE, RAY_TEMP_DIR_ENV

SNAKEMAKE_POLL_S = 1.0
LEFTOVER_GRACE_S = 3.0  # SIGTERM to SIGKILL for what a child left running
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
Handler = Callable[[int, FrameType | None], Any] | int | None


# What Snakemake's own process saw: the signal that interrupted it (None: none did).
_RUN: dict[str, int | None] = {"signal": None}


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


def forward_to_jobs() -> QuietStoppedJobs:
    """In Snakemake's main process: on SIGINT, send SIGTERM to every `rlbuild` job command, then let
    Snakemake's own handling follow. Returns the filter that keeps the stopped jobs' error blocks out of its log."""
    quiet = QuietStoppedJobs()
    logging.getLogger("snakemake.logging").addFilter(quiet)
    previous = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: FrameType | None) -> None:
        first = _RUN["signal"] is None
        _RUN["signal"] = _RUN["signal"] or signum
        for process in psutil.Process().children(recursive=True):
            if _is_rlbuild_job(process):
                with contextlib.suppress(psutil.Error):  # it ended meanwhile
                    process.send_signal(signal.SIGTERM)
        if not first:  # Snakemake is already stopping: a second KeyboardInterrupt would break its shutdown
            return
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, handler)
    return quiet


def interrupted_by() -> str | None:
    """The signal that interrupted this Snakemake process (forward_to_jobs saw it), or None."""
    return None if _RUN["signal"] is None else signal.Signals(_RUN["signal"]).name


class QuietStoppedJobs(logging.Filter):
    """On Snakemake's logger: drops its error block for a job that exited INTERRUPTED_EXIT_CODE (the job's
    exception, then the `Error in rule` record its executor logs next from the same thread) and notes the job's id;
    notes the id of every other failed job too, so that a real failure is never mistaken for an interrupt."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped: list[int] = []
        self.failed: list[int] = []
        self._dropping = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        if hasattr(record, "rule_name") and hasattr(record, "jobid"):  # `Error in rule X, jobid: N`
            dropped = getattr(self._dropping, "next", False)
            self._dropping.next = False
            (self.stopped if dropped else self.failed).append(int(record.jobid))
            return not dropped
        if _exited_interrupted(record.getMessage()):
            self._dropping.next = True
            return False
        return True


def _exited_interrupted(message: str) -> bool:
    """A job's CalledProcessError for a stop on request: exit 130 (a job command that stopped cleanly), or, once
    Snakemake itself was interrupted, the forwarded SIGTERM or the terminal's SIGINT ending a job that had not yet
    installed its handlers (exit 143 or 130 from its shell, or death by the signal)."""
    if "CalledProcessError" not in message:
        return False
    codes = [INTERRUPTED_EXIT_CODE] + ([128 + signal.SIGTERM] if _RUN["signal"] is not None else [])
    if any(f"non-zero exit status {code}." in message for code in codes):
        return True
    return _RUN["signal"] is not None and any(f"died with <Signals.{s.name}: " in message for s in _STOPS)


_STOPS = (signal.SIGINT, signal.SIGTERM)


def stopped_line(signal_name: str | None, where: Sequence[str], command: Sequence[str]) -> str:
    """The one line an interrupted run ends with: what stopped where, and the command that resumes it."""
    why = f"interrupted ({signal_name})" if signal_name else "interrupted"
    stopped = f"stopped {'; '.join(where)}" if where else "stopped before its jobs finished"
    return f"rlbuild: {why}: {stopped}; to resume, run the same command again: {' '.join(map(_typed, command))}"


def _typed(word: str) -> str:
    """A word quoted as a person types it: `"versions=['2026.09.21']"` rather than shlex's `'...'"'"'...'`."""
    quoted = shlex.quote(word)
    if quoted != word and "'" in word and not any(c in word for c in '"$`\\!'):
        return f'"{word}"'
    return quoted


def end_by_signal(signum: int) -> NoReturn:
    """End this process as the signal's default action would, after Python's own exit (`finally` blocks: Snakemake
    releases its lock) and a flush of its logs. A shell then reports 128 + N (130 for Ctrl-C) and, unlike after a
    child that *exited* 130, stops the script that ran it: bash goes on to a script's next line when a child
    handled its Ctrl-C and exited, and make says "Interrupt" rather than "Error 130"."""

    def die() -> None:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    atexit.register(die)  # registered last, so it runs first: the exit handlers before it have nothing of ours
    raise SystemExit(128 + signum)


def snakemake_command(argv: Sequence[str]) -> list[str]:
    """The command line that started this Snakemake, as a person would type it again."""
    return ["snakemake", *argv[1:]]


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
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
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


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:  # gone meanwhile
        return None


def _prctl(option: int, value: int) -> None:
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def end_session(session: int, grace_s: float = LEFTOVER_GRACE_S) -> list[int]:
    """SIGTERM every process below this one in `session` (a child started by `start_child` leads its own), SIGKILL
    those left after `grace_s`, reap them; their pids."""
    left = [p for p in psutil.Process().children(recursive=True) if _session_of(p.pid) == session]
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(left, timeout=grace_s)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return [process.pid for process in left]


def end_run(folder: str) -> list[int]:
    """SIGKILL every process of the run whose Ray session lives in `folder` (each inherited RAY_TEMP_DIR_ENV naming
    it: the trainer and every Ray process it started, wherever they were reparented), then remove the folder."""
    ended = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(RAY_TEMP_DIR_ENV) == folder:
                process.kill()
                ended.append(process)
        except psutil.Error:  # gone meanwhile, or not ours to read
            continue
    psutil.wait_procs(ended, timeout=LEFTOVER_GRACE_S)
    shutil.rmtree(folder, ignore_errors=True)
    return [process.pid for process in ended]


@contextlib.contextmanager
def supervised() -> Iterator[dict[str, str]]:
    """Around a child this process supervises (the trainer): yields the child's environment, naming a fresh Ray
    session folder. On the way out, whatever ended the child, every process it left is ended (they were adopted:
    this process is their subreaper) and the folder removed. A watchdog in a session of its own does the same if
    this process is killed too (SIGKILL of the whole process group)."""
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    folder = tempfile.mkdtemp(prefix="rlray-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    watchdog = subprocess.Popen(
        [sys.executable, "-m", "rlbuild.job.interrupts", str(os.getpid()), folder],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    try:
        yield {**os.environ, RAY_TEMP_DIR_ENV: folder}
    finally:
        watchdog.terminate()
        watchdog.wait()
        end_run(folder)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def watch(supervisor: int, folder: str, poll_s: float = 0.5) -> None:
    """The watchdog: once `supervisor` is gone, end what its run left (`end_run`)."""
    while _alive(supervisor):
        time.sleep(poll_s)
    end_run(folder)


if __name__ == "__main__":  # the watchdog of `supervised`
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the supervisor's to handle
    watch(int(sys.argv[1]), sys.argv[2])
