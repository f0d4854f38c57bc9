"""The Iris client, on the Iris library: submit a placement or adopt an earlier submission, cancel, and report a
failure; the executor plugin and the coordinator share it. The library costs about two seconds to import, so
`Iris` imports it when it is made (status and the gang bootstrap never do).
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlbuild.core.errors import RlbuildError
from rlbuild.schedulers.iris.rpc import GET_JOB_STATE, phase

if TYPE_CHECKING:
    from iris.client import JobStatus, TaskStatus
    from iris.cluster.types import JobName


class IrisSubmitError(RlbuildError):
    """Iris refused a job, or did not answer."""


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
