"""A stopped run is reported as stopped, and what it started ends with it (rlbuild/job/interrupts.py).

- Snakemake's error block for a job that exited 130 is left out, a real failure beside it is kept, and the line
  the run ends with says where it stopped and how to resume (the end-to-end run: tests/e2e/test_interrupts.py).
- What a trainer leaves running is ended with it, however it ends: `rlbuild train`'s supervision (`supervised`,
  rlbuild/job/attempt.py `run_logged`) on real processes. A stand-in trainer starts a process that outlives it, as
  its local Ray's services and agents do, in the Ray session folder it was given; the run's processes are told
  apart by that folder, not by name.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rlbuild.job import interrupts
from rlbuild.job.interrupts import QuietStoppedJobs, snakemake_command, stopped_line
from tests.conftest import REPO
from tests.faults import wait_until


class Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def failed_command(code: int) -> str:
    return (
        'RuleException:\nCalledProcessError in file "rules/train.smk", line 25:\nCommand \'set -euo pipefail;  '
        f"python -m rlbuild train ... | tee logs/train/v1.log' returned non-zero exit status {code}."
    )


def test_snakemake_s_error_block_of_a_stopped_job_is_left_out_and_a_real_failure_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    logger = logging.getLogger("snakemake.logging.test")
    quiet, kept = QuietStoppedJobs(), Kept()
    logger.addFilter(quiet)
    logger.addHandler(kept)
    logger.propagate = False
    logger.setLevel(logging.INFO)
    logger.info("localrule train:", extra={"rule_name": "train", "jobid": 7})  # the job's start: not an error
    logger.error(failed_command(130))
    logger.error("Error in rule train, jobid: 7", extra={"rule_name": "train", "jobid": 7})
    logger.error(failed_command(1))
    logger.error("Error in rule export, jobid: 8", extra={"rule_name": "export", "jobid": 8})
    assert (quiet.stopped, quiet.failed) == ([7], [8])
    assert kept.messages == ["localrule train:", failed_command(1), "Error in rule export, jobid: 8"]
    # A job that the forwarded SIGTERM ended before it listened (exit 143 from its shell) is a stop on request
    # only once Snakemake itself was interrupted.
    logger.error(failed_command(143))
    logger.error("Error in rule stage_data, jobid: 5", extra={"rule_name": "stage_data", "jobid": 5})
    assert quiet.failed == [8, 5]
    monkeypatch.setitem(interrupts._RUN, "signal", signal.SIGINT)
    logger.error(failed_command(143))
    logger.error("Error in rule base_model, jobid: 4", extra={"rule_name": "base_model", "jobid": 4})
    assert (quiet.stopped, quiet.failed) == ([7, 4], [8, 5])


def test_the_line_a_stopped_run_ends_with_says_where_and_how_to_resume() -> None:
    command = snakemake_command(["/x/bin/snakemake", "--cores", "2", "--config", "versions=['2026.09.21']"])
    where = ["train/v2026.09.21 at step 3, last checkpoint /r/global_step_3", "eval of v2026.09.21 (a rerun ...)"]
    assert stopped_line("SIGINT", where, command) == (
        "rlbuild: interrupted (SIGINT): stopped train/v2026.09.21 at step 3, last checkpoint /r/global_step_3; "
        "eval of v2026.09.21 (a rerun ...); to resume, run the same command again: "
        "snakemake --cores 2 --config \"versions=['2026.09.21']\""
    )


def test_an_interrupted_run_ends_by_its_signal_so_the_script_that_ran_it_stops_too(tmp_path: Path) -> None:
    """Ctrl-C reaches a script and the command it runs. A command that handles it and exits 130 lets bash go on
    to the script's next line (it takes the interrupt as handled); one that ends by SIGINT, after its `finally`
    blocks and with what it printed flushed, stops the script too, as the Snakemake process of a run does."""
    command = (
        "import signal, sys, time\n"
        "from rlbuild.job.interrupts import end_by_signal\n"
        "def stop(signum, frame):\n"
        "    sys.stdout.write(' the line it ends with')\n"  # unflushed: its exit must flush it
        "    try:\n        end_by_signal(signum)\n    finally:\n        print(' (finally ran)', end='')\n"
        "signal.signal(signal.SIGINT, stop)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    script = tmp_path / "run.sh"
    script.write_text(f"{sys.executable} -c {shlex.quote(command)}\necho ' the script went on'\n")
    run = subprocess.Popen(
        ["bash", str(script)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's foreground job has it
    )
    assert run.stdout is not None and run.stdout.readline() == "ready\n"
    os.killpg(run.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
    said, _ = run.communicate(timeout=60)
    assert said == " the line it ends with (finally ran)" and run.returncode == -signal.SIGINT, (said, run.returncode)


# The stand-in trainer: a "Ray service" of its own, then SIGKILLed (or it sleeps, for its supervisor to be killed).
TRAINER = """
import os, subprocess, sys, time
service = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
open(os.path.join(os.environ["RLBUILD_RAY_TEMP_DIR"], "session_1"), "w").write("sockets")
print(f"service {service.pid}", flush=True)
if sys.argv[1] == "kill-trainer":
    os.kill(os.getpid(), 9)
time.sleep(300)
"""
# `rlbuild train`'s local path: the trainer run under supervision, its output copied to its attempt's log.
SUPERVISOR = """
import sys
from rlbuild.job import interrupts
from rlbuild.job.attempt import run_logged
with interrupts.supervised() as env:
    print(f"folder {env['RLBUILD_RAY_TEMP_DIR']}", flush=True)
    code = run_logged([sys.executable, "-c", sys.argv[1], sys.argv[2]], sys.argv[3], env)
print(f"exited {code}", flush=True)
"""


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def supervise(how: str, tmp_path: Path) -> tuple[subprocess.Popen[str], Path, int]:
    command = [sys.executable, "-c", SUPERVISOR, TRAINER, how, str(tmp_path / "attempts")]
    supervisor = subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    assert supervisor.stdout is not None
    found: dict[str, str] = {}
    while len(found) < 2:
        line = supervisor.stdout.readline()
        assert line, f"the supervisor ended early: {found}"
        word, _, value = line.strip().partition(" ")
        if word in ("folder", "service"):
            found[word] = value
    return supervisor, Path(found["folder"]), int(found["service"])


def test_a_sigkilled_trainer_leaves_no_process_and_no_ray_session_folder(tmp_path: Path) -> None:
    supervisor, folder, service = supervise("kill-trainer", tmp_path)
    assert supervisor.stdout is not None
    rest = supervisor.stdout.read()
    assert supervisor.wait(timeout=30) == 0 and "exited -9" in rest, rest
    assert gone(service), "the trainer's service outlived its supervisor's run"
    assert not folder.exists(), f"{folder} left behind"


def test_a_sigkill_of_the_whole_group_is_cleaned_up_by_the_watchdog_within_5_s(tmp_path: Path) -> None:
    supervisor, folder, service = supervise("sleep", tmp_path)
    os.killpg(supervisor.pid, signal.SIGKILL)  # `rlbuild train` and its group: nobody left to clean up but the watchdog
    supervisor.wait(timeout=30)
    killed = time.monotonic()
    assert wait_until(lambda: gone(service) and not folder.exists(), 5, poll=0.1), (gone(service), folder.exists())
    print(f"cleaned up {time.monotonic() - killed:.1f} s after the supervisor's death")
