"""One attempt of a training job: an id, and its whole log kept in storage.

Every attempt (the first run, each resume, each retry) gets its own log stream under the run's attempts folder,
`<attempts_root>/logs/<attempt id>`, so no attempt's log is ever overwritten by the next; Snakemake's own log
file holds only the latest attempt. The stream is flushed every few seconds, so the log of an attempt that is
killed survives up to its last flush.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime

from rlbuild.core import storage
from rlbuild.core.redact import redact_text
from rlbuild.core.streams import StreamWriter
from rlbuild.job.interrupts import Forwarder, end_session, start_child

LOG_FLUSH_S = 10.0


def attempt_id() -> str:
    """Sortable by start time, unique across hosts: `20260921T101500Z-host-1a2b3c`."""
    started = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())[:40]
    return f"{started}-{host}-{uuid.uuid4().hex[:6]}"


def log_uri(attempts_root: str, attempt: str) -> str:
    return storage.join(attempts_root, "logs", attempt)


def run_logged(command: list[str], attempts_root: str, env: Mapping[str, str] | None = None) -> int:
    """Run `command` (in `env`), copying its output to stderr and to this attempt's log stream; returns its code.

    SIGTERM and SIGINT are passed on to the command once (rlbuild/job/interrupts.py), so it can stop cleanly while
    its output is still recorded; the command dies with this process, and what it leaves running is ended when it
    exits (its orphans may hold its output open: the copy ends after them).
    """
    attempt = attempt_id()
    uri = log_uri(attempts_root, attempt)
    print(f"[rlbuild] attempt {attempt}: log {uri}", file=sys.stderr, flush=True)
    log = StreamWriter(uri, flush_s=LOG_FLUSH_S)
    log.write(f"[rlbuild] attempt {attempt} on {socket.gethostname()}: {' '.join(command)}\n")
    process = start_child(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, env=env)
    with Forwarder(process):
        assert process.stdout is not None
        copy = threading.Thread(target=_copy, args=(process.stdout, log), name="rlbuild-attempt-log", daemon=True)
        copy.start()
        code = process.wait()
        end_session(process.pid)  # what it left in its session (adopted: see interrupts.supervised)
        copy.join()
    if refused := _stored(log, f"[rlbuild] attempt {attempt} exited with code {code}\n", final=True):
        print(f"[rlbuild] the attempt's log could not be stored at {uri}: {refused}", file=sys.stderr, flush=True)
    return code


def _stored(log: StreamWriter, line: str, final: bool = False) -> OSError | None:
    """A line into the attempt's log; the error of a refused write (a full disk), whose lines stay buffered for
    the next flush, which the attempt's end tries again: the trainer never waits on its log."""
    try:
        log.write(line)
        if final:
            log.close()
    except OSError as error:
        return error
    return None


def _copy(lines: Iterable[str], log: StreamWriter) -> None:
    echo, said = True, False
    for line in lines:
        refused = _stored(log, redact_text(line))
        if refused and not said:
            said, line = True, f"[rlbuild] the attempt's log could not be stored at {log.uri}: {refused}\n{line}"
        if echo:
            try:
                sys.stderr.write(line)
            except OSError:  # whoever read our stderr is gone (an interrupted `| tee`): keep the stored log
                echo = False
