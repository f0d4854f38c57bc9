"""The seam per scheduler (rlbuild/schedulers/): the registry by name and by task environment, and what each
scheduler's words for a job's state mean (squeue/sacct output, Iris's GetJobState answer), as status reads them."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlbuild.job.rendezvous import GangTaskError
from rlbuild.ops.status import Options, job_ended, scheduler_state
from rlbuild.schedulers.base import JobState, Phase, SchedulerUnavailableError
from rlbuild.schedulers.iris import rpc as iris
from rlbuild.schedulers.iris.scheduler import IrisScheduler
from rlbuild.schedulers.local import scheduler as local
from rlbuild.schedulers.registry import (
    SCHEDULERS,
    UnknownSchedulerError,
    job_here,
    job_scheduler,
    scheduler_for,
    task_scheduler,
)
from rlbuild.schedulers.slurm import scheduler as slurm
from tests.conftest import EXPERIMENTS, REPO, run_snakemake


def test_every_scheduler_is_found_by_its_name_and_a_wrong_name_is_named_with_the_choices() -> None:
    assert tuple(SCHEDULERS) == ("iris", "slurm", "local")  # asked in this order which runs this process
    for name in SCHEDULERS:
        assert scheduler_for(name).name == name
    assert scheduler_for("iris", "http://controller:10000").address == "http://controller:10000"
    with pytest.raises(UnknownSchedulerError) as raised:
        scheduler_for("pbs", where="head.json")
    assert str(raised.value) == "head.json: unknown scheduler 'pbs'; rlbuild knows 'iris', 'slurm', 'local'"


def test_the_task_environment_says_which_scheduler_runs_this_process() -> None:
    on_iris = task_scheduler({"IRIS_TASK_ID": "/u/job/0:1", "IRIS_CONTROLLER_URL": "http://c:1"})
    assert (on_iris.name, on_iris.address) == ("iris", "http://c:1")
    assert task_scheduler({"SLURM_PROCID": "0", "SLURM_JOB_ID": "7"}).name == "slurm"
    assert task_scheduler({"SLURM_JOB_ID": "7"}).name == "local"  # a batch script, not a task of a step
    # ... but it runs in a Slurm job: its train job is a link of a chain, and a lease names the job.
    assert job_scheduler({"SLURM_JOB_ID": "7"}).name == "slurm" and job_here({"SLURM_JOB_ID": "7"}) == ("slurm", "7")
    assert job_here({"IRIS_TASK_ID": "/u/job/0:1"}) == ("iris", "/u/job") and job_here({}) is None
    assert job_scheduler({}).name == "local"
    alone = task_scheduler({})
    assert alone.name == "local"
    with pytest.raises(GangTaskError, match="run the bootstrap as a task of a cluster scheduler"):
        alone.task({})
    assert alone.job_states(["x"]) == {"x": JobState(Phase.UNKNOWN, note=local.NO_JOB)}
    said: list[str] = []
    alone.refuse_retry({}, said.append)
    assert said == []  # nothing would restart a local task


@pytest.mark.parametrize(
    ("stdout", "word", "phase"),
    [
        ("PENDING\n", "pending", Phase.PENDING),  # squeue -o %T
        ("CONFIGURING\n", "configuring", Phase.PENDING),
        ("REQUEUED\n", "requeued", Phase.PENDING),  # a chain's next link
        ("RUNNING\n", "running", Phase.RUNNING),
        ("COMPLETING\n", "completing", Phase.RUNNING),  # still ending: not yet a failure
        ("SUSPENDED\n", "suspended", Phase.RUNNING),
        ("COMPLETED\n", "completed", Phase.SUCCEEDED),
        ("CANCELLED by 1000\n", "cancelled", Phase.FAILED),  # sacct -P -o State
        ("TIMEOUT\n", "timeout", Phase.FAILED),
        ("OUT_OF_MEMORY\n", "out_of_memory", Phase.FAILED),
        ("NODE_FAIL\n", "node_fail", Phase.FAILED),
        ("PREEMPTED\n", "preempted", Phase.FAILED),
        ("RUNNING\nRUNNING\n", "running", Phase.RUNNING),  # one line per step or array task: the first
        ("OUT_OF_ME+\n", "out_of_me+", Phase.UNKNOWN),  # a truncated column is not guessed at
    ],
)
def test_slurm_state_words_map_to_phases(stdout: str, word: str, phase: Phase) -> None:
    assert slurm.state_word(stdout) == word
    assert slurm.phase(word) is phase


def test_slurm_without_an_answer_is_unknown_with_the_reason() -> None:
    assert slurm.state_word("") is None
    states = slurm.Slurm().job_states(["slurm-999999999"])  # the real squeue/sacct: no such job, or no Slurm
    assert states == {"slurm-999999999": JobState(Phase.UNKNOWN, note=slurm.UNKNOWN_JOB)}


def test_iris_answers_map_to_phases_and_a_job_it_does_not_know_is_unknown() -> None:
    answer = {"states": {"/u/a": "JOB_STATE_RUNNING", "/u/b": "JOB_STATE_KILLED", "/u/c": "JOB_STATE_NEW_IDEA"}}
    words = iris.state_words(answer)
    assert words == {"/u/a": "running", "/u/b": "killed", "/u/c": "new_idea"}
    assert [iris.phase(w) for w in words.values()] == [Phase.RUNNING, Phase.FAILED, Phase.UNKNOWN]
    assert iris.state_words({}) == {}
    with pytest.raises(SchedulerUnavailableError, match="GetJobState"):
        iris.state_words({"states": ["not", "a", "map"]})


def test_iris_without_a_controller_or_with_a_dead_one_says_why() -> None:
    assert IrisScheduler().job_states(["/u/a"]) == {"/u/a": JobState(Phase.UNKNOWN, note=iris.NO_CONTROLLER)}
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    with pytest.raises(SchedulerUnavailableError, match=f"the Iris controller at {url} did not answer"):
        IrisScheduler(url).job_states(["/u/a"])
    said: list[str] = []
    IrisScheduler(url).refuse_retry({"IRIS_TASK_ID": "/u/a/0:0"}, said.append)
    assert said[0] == "cancelling Iris job /u/a: a retry would fail the same way"  # said before the cancel kills us
    assert said[1].startswith(f"could not cancel Iris job /u/a, so Iris may retry it: the Iris controller at {url}")
    assert len(said) == 2
    IrisScheduler().refuse_retry({"IRIS_TASK_ID": "/u/a/0:0"}, said.append)
    assert len(said) == 2  # no controller to ask


def test_status_asks_the_recorded_scheduler_and_only_an_ended_job_ends_a_train() -> None:
    unknown = scheduler_state("pbs", "job-1", Options())
    assert unknown["job_state"] is None and "unknown scheduler 'pbs'" in unknown["job_state_note"]
    no_controller = scheduler_state("iris", "/u/a", Options())
    assert no_controller == {"job_state": None, "job_phase": "unknown", "job_state_note": iris.NO_CONTROLLER}
    assert job_ended({"job_phase": "failed"}) and job_ended({"job_phase": "succeeded"})
    assert not job_ended({"job_phase": "running"}) and not job_ended({"job_phase": "unknown"})
    assert not job_ended(None) and not job_ended({})


# A fourth scheduler, written as a package of its own would be and registered from outside rlbuild: its settings
# model, the resources it puts on rules, its preflight problem and its plan lines are all it defines.
ECHO_PACKAGE = """
from typing import Any

from rlbuild.core.errors import Violation
from rlbuild.core.validation import StrictModel
from rlbuild.schedulers.base import JobRequest, PlanFacts, Scheduler


class EchoSettings(StrictModel):
    queue: str


class Echo(Scheduler):
    name = "echo"
    title = "Echo"
    settings_model = EchoSettings

    @classmethod
    def for_task(cls, environ):
        return None

    def job_states(self, jobs):
        return {}

    def cancel(self, job):
        return None

    def task(self, environ):
        raise NotImplementedError

    def gang_ports(self, environ, rank):
        raise NotImplementedError

    @classmethod
    def owns_resource(cls, resource: str) -> bool:
        return resource.startswith("echo_")

    @classmethod
    def rule_resources(cls, settings: Any, request: JobRequest) -> dict:
        return {"echo_queue": settings.queue} if settings is not None else {}

    @classmethod
    def problems(cls, settings: Any, facts: PlanFacts) -> list:
        if settings is not None and settings.queue == "full":
            return [Violation("execution.echo.queue", "'full' takes no jobs", "name another queue")]
        return []

    @classmethod
    def plan_section(cls, settings: Any, facts: PlanFacts) -> dict | None:
        return {"queue": settings.queue, "nodes": facts.gang.num_nodes} if settings is not None else None

    @classmethod
    def plan_lines(cls, section: dict, facts: PlanFacts) -> list:
        return [f"  echo           queue {section['queue']}, {section['nodes']} node(s) echoed"]
"""
DRIVER = """
import sys

from echo_scheduler import Echo
from rlbuild.schedulers.registry import register

register(Echo)  # before the experiment's model is built

from snakemake.cli import main

main(sys.argv[1:])
"""


def test_a_scheduler_registered_from_outside_rlbuild_is_checked_and_planned_by_the_default_graph(
    tmp_path: Path,
) -> None:
    """Adding a scheduler touches its own package and the registry only: registered from this test, the default
    graph's dry run validates its section, asks it for problems and resources, and prints its plan lines."""
    (tmp_path / "echo_scheduler").mkdir()
    (tmp_path / "echo_scheduler" / "__init__.py").write_text(ECHO_PACKAGE)
    (tmp_path / "driver.py").write_text(DRIVER)

    def dry_run(echo: dict[str, object]) -> subprocess.CompletedProcess[str]:
        doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
        doc["execution"]["echo"] = echo
        path = tmp_path / "echo.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        argv = ["-n", "--jobs", "2", "--config", f"experiment={path}", f"storage_root={tmp_path / 'results'}"]
        env = {"PYTHONPATH": f"{tmp_path}:{REPO}"}
        return run_snakemake(argv, cwd=tmp_path, env=env, launcher=[sys.executable, str(tmp_path / "driver.py")])

    planned = dry_run({"queue": "batch"})
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "  echo           queue batch, 1 node(s) echoed" in planned.stderr
    assert "  iris           cluster local" in planned.stderr  # the others still plan beside it
    refused = dry_run({"queue": "full", "queu": "typo"})
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "execution.echo.queu: unknown key; did you mean 'queue'?" in refused.stderr
    refused = dry_run({"queue": "full"})
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "execution.echo.queue: 'full' takes no jobs; name another queue" in refused.stderr
