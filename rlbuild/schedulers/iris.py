"""Iris as rlbuild sees it, in one module: the scheduler interface (`IrisScheduler`: job states and cancelling
over the controller's Connect-RPC JSON, a gang task's rank, attempt and ports from Iris's variables) and the Iris
client (`Iris`, on the Iris library: submit a placement or adopt an earlier submission, failure reports), which the
executor plugin and the coordinator share.

The interface needs no client library: `GetJobState` answers for many jobs in one call (the plugin polls every
active job in one round trip) and `rlbuild status` and the gang bootstrap work without importing the Iris client,
which costs about two seconds; `Iris` imports it when it is made.
"""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlbuild.core.errors import RlbuildError
from rlbuild.core.wire import RAY_PORT_NAMES
from rlbuild.schedulers.base import GangTaskError, JobState, Phase, Scheduler, SchedulerUnavailableError, TaskIdentity

if TYPE_CHECKING:
    from iris.client import JobStatus, TaskStatus
    from iris.cluster.types import JobName

GET_JOB_STATE = "iris.cluster.ControllerService/GetJobState"
TERMINATE_JOB = "iris.cluster.ControllerService/TerminateJob"
RPC_TIMEOUT_S = 10.0
# Iris's job states (`iris.client.JobState`, the wire names GetJobState answers), lower-case.
PHASES = {
    "pending": Phase.PENDING,
    "building": Phase.PENDING,  # placed on a worker, its environment being built
    "running": Phase.RUNNING,
    "succeeded": Phase.SUCCEEDED,
    "failed": Phase.FAILED,
    "killed": Phase.FAILED,
    "worker_failed": Phase.FAILED,
    "unschedulable": Phase.FAILED,
}
NO_CONTROLLER = "no Iris controller given (--iris-controller-url)"
UNKNOWN_JOB = "Iris does not know this job"


class IrisSubmitError(RlbuildError):
    """Iris refused a job, or did not answer."""


def phase(word: str) -> Phase:
    """SUCCEEDED only for `succeeded`; every other terminal state is FAILED; a word a later Iris adds (or the
    proto's `unspecified`) is UNKNOWN."""
    return PHASES.get(word.lower(), Phase.UNKNOWN)


def state_words(answer: Mapping[str, object]) -> dict[str, str]:
    """`{job id: state}` from GetJobState's JSON answer (`{"states": {job: "JOB_STATE_RUNNING"}}`), lower-case."""
    found = answer.get("states") or {}
    if not isinstance(found, dict):
        raise SchedulerUnavailableError(f"the Iris controller answered {GET_JOB_STATE} with {answer!r}")
    return {job: str(state).removeprefix("JOB_STATE_").lower() for job, state in found.items()}


def _post(url: str, method: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"{url.rstrip('/')}/{method}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=RPC_TIMEOUT_S) as response:
            return json.loads(response.read() or b"{}")
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise SchedulerUnavailableError(
            f"the Iris controller at {url} did not answer {method} ({error}); check the controller URL "
            "(SNAKEMAKE_IRIS_CONTROLLER_URL) and that the controller or its tunnel is up"
        ) from error


class IrisScheduler(Scheduler):
    name = "iris"
    title = "Iris"

    @classmethod
    def for_task(cls, environ: Mapping[str, str]) -> IrisScheduler | None:
        """Every Iris task has `IRIS_TASK_ID` and `IRIS_CONTROLLER_URL`."""
        return cls(environ.get("IRIS_CONTROLLER_URL") or None) if "IRIS_TASK_ID" in environ else None

    def job_states(self, jobs: Sequence[str]) -> dict[str, JobState]:
        if not self.address:
            return {job: JobState(Phase.UNKNOWN, note=NO_CONTROLLER) for job in jobs}
        words = state_words(_post(self.address, GET_JOB_STATE, {"jobIds": list(jobs)})) if jobs else {}
        return {
            job: JobState(phase(words[job]), words[job]) if job in words else JobState(Phase.UNKNOWN, note=UNKNOWN_JOB)
            for job in jobs
        }

    def cancel(self, job: str) -> None:
        """TerminateJob: the job and its children (the jobs a coordinator submitted)."""
        if not self.address:
            raise SchedulerUnavailableError(f"{NO_CONTROLLER}: cannot cancel {job}")
        _post(self.address, TERMINATE_JOB, {"jobId": job})

    def task(self, environ: Mapping[str, str]) -> TaskIdentity:
        """`IRIS_TASK_ID` = `/<user>/<job>/<index>:<attempt>`: the index is the rank."""
        task_id = environ.get("IRIS_TASK_ID", "")
        job, sep, tail = task_id.rpartition("/")
        index, colon, attempt = tail.partition(":")
        if not sep or not job or not index.isdigit() or (colon and not attempt.isdigit()):
            raise GangTaskError(
                f"IRIS_TASK_ID={task_id!r} is not '/<user>/<job>/<index>:<attempt>'; "
                "run the bootstrap as an Iris task or a Slurm task (srun)"
            )
        return TaskIdentity(job=job, rank=int(index), attempt=int(attempt or 0), scheduler=self.name)

    def gang_ports(self, environ: Mapping[str, str], rank: int) -> dict[str, int]:
        """Iris hands each gang task its ports (IRIS_PORT_<NAME>)."""
        ports = {}
        for name in RAY_PORT_NAMES:
            value = environ.get(f"IRIS_PORT_{name.upper()}")
            if not value or not value.isdigit() or value == "0":
                raise GangTaskError(
                    f"IRIS_PORT_{name.upper()} is not set; submit the gang with ports={list(RAY_PORT_NAMES)}"
                )
            ports[name] = int(value)
        return ports

    def advertise_host(self, environ: Mapping[str, str]) -> str:
        return environ.get("IRIS_ADVERTISE_HOST") or super().advertise_host(environ)

    def refuse_retry(self, environ: Mapping[str, str], log: Callable[[str], None]) -> None:
        """Cancel this task's own job, so Iris does not restart the gang into the same failure. The notice goes out
        first: the cancel kills this task (SIGTERM), often before a line written after it could be shipped."""
        job = environ.get("IRIS_TASK_ID", "").rpartition("/")[0]
        if not self.address or not job:
            return
        log(f"cancelling Iris job {job}: a retry would fail the same way")
        try:
            self.cancel(job)
        except SchedulerUnavailableError as error:
            log(f"could not cancel Iris job {job}, so Iris may retry it: {error}")


@dataclass(frozen=True)
class Placement:
    """Resources of one Iris job: `replicas` tasks of this size each."""

    replicas: int
    cpu: float
    memory: str
    disk: str
    gpu_variant: str | None
    gpus_per_node: int
    priority: str
    max_retries: int
    coschedule: str | None
    # The rule declared `gpu_nodes`: its tasks run the gang bootstrap (Ray under a short socket folder, the
    # runtime-digest check), also for one node and for CPU "GPUs" (the embedded default).
    is_gang: bool = False


@dataclass(frozen=True)
class Submission:
    command: list[str]
    env: dict[str, str]
    ports: list[str]
    scheduling_timeout_s: int
    cpu_pool: str | None
    # The task runs the workspace bundle the client sends (not a checkout the node shares): without an image Iris
    # sets it up from the bundle's uv.lock (`uv sync`, with these extras); an image is run as it is.
    bundled: bool = False
    image: str | None = None
    extras: tuple[str, ...] = ()


class Iris:
    """One connection to an Iris controller."""

    def __init__(self, url: str, workspace: Path | None = None) -> None:
        """`workspace`: the folder every submitted task gets as its bundle, unpacked into `$IRIS_WORKDIR`
        (its git-tracked and untracked-but-not-ignored files, less pyproject's `[tool.iris.bundle]` excludes)."""
        from iris.client import IrisClient

        self.url = url.rstrip("/")
        probe(self.url)
        self.client = IrisClient.remote(self.url, workspace=workspace)

    def job_id(self, name: str) -> JobName:
        """Where Iris puts a job of this name: a child of the job we run in (a coordinator submitted by `rlbuild
        submit`, so cancelling it cancels its jobs), else a root job of this user."""
        from iris.client.client import get_iris_ctx
        from iris.cluster.client.job_info import resolve_job_user
        from iris.cluster.types import JobName

        context = get_iris_ctx()
        if context is not None and context.job_id is not None:
            return context.job_id.child(name)
        return JobName.root(resolve_job_user(), name)

    def find_active(self, name: str) -> JobName | None:
        """The job of this name if it is still pending or running (a restarted Snakemake adopts it)."""
        from connectrpc.code import Code
        from connectrpc.errors import ConnectError

        job_id = self.job_id(name)
        try:
            state = self.client.job_state(job_id)
        except ConnectError as error:
            if error.code == Code.NOT_FOUND:
                return None
            raise IrisSubmitError(f"Iris at {self.url} did not answer for job {name}: {error}") from error
        return job_id if phase(state.value).alive else None

    def submit(self, name: str, place: Placement, sub: Submission) -> tuple[JobName, bool]:
        """Submit, or adopt a running job of the same name. Returns (job id, adopted)."""
        from connectrpc.errors import ConnectError
        from iris.client import JobAlreadyExists

        found = self.find_active(name)
        if found is not None:
            return found, True
        try:
            job = self.client.submit(**_request(name, place, sub))
        except JobAlreadyExists:
            return self.job_id(name), True
        except (ConnectError, ValueError) as error:
            raise IrisSubmitError(f"Iris at {self.url} refused job {name}: {error}") from error
        return job.job_id, False

    def status(self, job_id: JobName) -> JobStatus:
        return self.client.job_status(job_id)

    def cancel(self, job_id: JobName) -> None:
        self.client.cancel_job(job_id)

    def failure_report(self, job_id: JobName, tail_lines: int) -> tuple[str, str]:
        """(one-paragraph summary, the tail of every task's log) of a job that ended without success."""
        status = self.status(job_id)
        parts = [f"Iris job {job_id.to_wire()} ended {status.state.value}"]
        if status.error_message:
            parts.append(status.error_message)
        if status.pending_reason and status.pending_reason != status.error_message:
            parts.append(f"last scheduling note: {status.pending_reason}")
        if status.failure_count:
            parts.append(f"failed attempts: {status.failure_count}")
        tasks = self.client.list_tasks(job_id)
        if tasks:
            parts.append("tasks: " + ", ".join(_describe(t) for t in sorted(tasks, key=lambda t: t.task_id.to_wire())))
        lines: dict[str, list[str]] = defaultdict(list)
        for entry in self.client.job(job_id).logs(tail=True, max_lines=tail_lines * max(len(tasks), 1)):
            lines[f"{entry.task_id.to_wire()} attempt {entry.attempt_id}"].append(entry.data)
        logs = "\n".join(
            f"--- {task} (last {min(len(text), tail_lines)} lines) ---\n" + "\n".join(text[-tail_lines:])
            for task, text in sorted(lines.items())
        )
        return "; ".join(parts), logs

    def close(self) -> None:
        self.client.shutdown()


def _request(name: str, place: Placement, sub: Submission) -> dict[str, object]:
    """The Iris client's `submit` arguments for one placement and submission."""
    from iris.cluster.constraints import Constraint, ConstraintOp
    from iris.cluster.types import CoschedulingConfig, Entrypoint, EnvironmentSpec, ResourceSpec, gpu_device
    from iris.rpc.proto_display import priority_band_value
    from rigging.secrets import SecretBehavior
    from rigging.timing import Duration

    device = gpu_device(place.gpu_variant, place.gpus_per_node) if place.gpu_variant else None
    # An explicit list, also when empty: inside a coordinator, None would inherit its (CPU pool) constraints.
    constraints = []
    if sub.cpu_pool and place.gpu_variant is None:
        constraints = [Constraint.create(key="pool", op=ConstraintOp.EQ, value=sub.cpu_pool)]
    return {
        "entrypoint": Entrypoint.from_command(*sub.command),
        "name": name,
        "resources": ResourceSpec(cpu=place.cpu, memory=place.memory, disk=place.disk, device=device),
        "environment": EnvironmentSpec(
            env_vars=sub.env,
            # None: Iris's default set-up of the bundle (uv sync of its lock); []: none (an image, a shared venv).
            setup_scripts=None if sub.bundled and sub.image is None else [],
            extras=list(sub.extras) or None,
            secret_behavior=SecretBehavior.ISOLATE,
        ),
        "task_image": sub.image,
        "ports": sub.ports or None,
        "scheduling_timeout": Duration.from_seconds(sub.scheduling_timeout_s),
        "constraints": constraints,
        "coscheduling": CoschedulingConfig(group_by=place.coschedule) if place.coschedule else None,
        "replicas": place.replicas,
        # Both budgets: with only the per-task one Iris fails the job on the first failure.
        "max_retries_failure": place.max_retries,
        "max_task_failures": place.max_retries,
        "priority_band": priority_band_value(place.priority),
    }


def shell(cwd: str, command: str) -> list[str]:
    """Iris tasks start in the controller's folder: run the command from the submitter's (a shared checkout)."""
    return ["bash", "-c", f"cd {shlex.quote(cwd)} && {command}"]


def in_bundle(command: str) -> list[str]:
    """Run the command from the task's unpacked bundle. Its folder leads PYTHONPATH, so every Python process of
    the task (Ray's workers too) imports the bundle's rlbuild and trainer, not an installed copy."""
    enter = 'cd "$IRIS_WORKDIR" && export PYTHONPATH="$IRIS_WORKDIR${PYTHONPATH:+:$PYTHONPATH}"'
    return ["bash", "-c", f"{enter} && {command}"]


def probe(url: str, timeout_s: float = 10.0) -> None:
    """Fail fast on a wrong or unreachable controller; the client's own calls retry for up to 30 minutes, which is
    right for riding out a controller restart mid-run but not for a typo at start-up."""
    import httpx

    try:
        response = httpx.post(f"{url}/{GET_JOB_STATE}", json={"jobIds": []}, timeout=timeout_s)
    except httpx.HTTPError as error:
        raise IrisSubmitError(
            f"Iris controller at {url} is unreachable ({error}); check --iris-controller-url "
            "(SNAKEMAKE_IRIS_CONTROLLER_URL) and that the controller or its tunnel is up"
        ) from error
    if response.status_code != 200:
        raise IrisSubmitError(
            f"{url} answered {response.status_code} to {GET_JOB_STATE}: not an Iris controller? "
            "Check --iris-controller-url (SNAKEMAKE_IRIS_CONTROLLER_URL)"
        )


def _describe(task: TaskStatus) -> str:
    text = f"{task.task_id.to_wire().rsplit('/', 1)[-1]}={task.state.value}"
    if task.exit_code:
        text += f" exit {task.exit_code}"
    return f"{text} ({task.error_message})" if task.error_message else text
