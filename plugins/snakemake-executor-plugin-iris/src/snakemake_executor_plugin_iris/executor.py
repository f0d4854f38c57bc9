"""The Iris executor: submits Snakemake jobs to Iris (gangs for GPU rules), polls them, cancels them."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snakemake_interface_common.exceptions import WorkflowError
from snakemake_interface_executor_plugins.executors.base import SubmittedJobInfo
from snakemake_interface_executor_plugins.executors.remote import RemoteExecutor
from snakemake_interface_executor_plugins.jobs import JobExecutorInterface
from snakemake_interface_executor_plugins.settings import SharedFSUsage

from rlbuild.core.redact import redact_text
from rlbuild.core.wire import RAY_PORT_NAMES
from rlbuild.schedulers.base import JobState, Phase, SchedulerUnavailableError
from rlbuild.schedulers.iris.client import Iris, IrisSubmitError, Submission, in_bundle, shell
from rlbuild.schedulers.iris.scheduler import IrisScheduler
from snakemake_executor_plugin_iris.errors import IrisSettingError
from snakemake_executor_plugin_iris.names import job_name
from snakemake_executor_plugin_iris.requests import (
    Defaults,
    gang_command,
    placement,
    priority,
    runtime_extras,
    runtime_image,
    task_env,
)

if TYPE_CHECKING:
    from snakemake_executor_plugin_iris import ExecutorSettings

# The Iris library (and rigging) are imported where they are used (rlbuild/schedulers/iris/ imports it when an
# `Iris` is made): Snakemake imports every installed executor plugin on each start, and `iris.client` alone costs
# about a second of every dry run.

LOG_LAG_S = 2.0  # Iris's logs trail a job's terminal state by 1-2 s


def controller_url(settings: ExecutorSettings) -> str:
    if settings.controller_url:
        return settings.controller_url
    if settings.cluster:
        from rigging.credential_store import load_credentials

        record = load_credentials(settings.cluster)
        if record is None:
            raise IrisSettingError(
                "iris-cluster",
                settings.cluster,
                "no endpoint recorded; run `iris login` or pass --iris-controller-url",
            )
        return record.endpoint
    raise IrisSettingError(
        "iris-controller-url", None, "set --iris-controller-url (or SNAKEMAKE_IRIS_CONTROLLER_URL, or --iris-cluster)"
    )


def storage_uri(path: Any) -> str:
    """The location of an input as every node can reach it: its storage query (s3://...) or absolute path."""
    if getattr(path, "is_storage", False):
        return str(path.storage_object.query)
    return os.path.abspath(str(path))


class Executor(RemoteExecutor):
    def __post_init__(self) -> None:
        self.settings: ExecutorSettings = self.workflow.executor_settings
        # Snakemake's own setting says whether the nodes see this checkout (`--shared-fs-usage sources`, a local
        # cluster, an image with the repository at this path) or get it as an Iris bundle (the iris profile).
        self.bundled = SharedFSUsage.SOURCES not in self.workflow.storage_settings.shared_fs_usage
        workflow_folder = Path(self.workflow.main_snakefile).resolve().parent
        if self.bundled:
            # The job's Snakemake runs from the unpacked bundle: name the Snakefile as the bundle holds it.
            self.snakefile = os.path.relpath(self.workflow.main_snakefile, workflow_folder)
        try:
            self.iris = Iris(controller_url(self.settings), workspace=workflow_folder if self.bundled else None)
        except IrisSubmitError as error:
            raise WorkflowError(str(error)) from error
        self.scheduler = IrisScheduler(self.iris.url)
        self.defaults = Defaults(
            cpu=self.settings.node_cpu,
            memory=self.settings.node_memory,
            disk=self.settings.node_disk,
            priority=priority("iris-priority", self.settings.priority),
            max_retries=self.settings.max_retries,
            coschedule=self.settings.coschedule,
        )
        self.iris_rules = _names(self.settings.rules)
        self.extra_env = _names(self.settings.env) or []
        self.log_dir = Path(".snakemake", "iris").resolve()
        if self.settings.status_interval is not None:
            self.next_seconds_between_status_checks = self.settings.status_interval

    # Submission

    def run_job(self, job: JobExecutorInterface) -> None:
        try:
            resources = dict(job.resources)
            if self.iris_rules is not None and "gpu_nodes" not in resources and job.name not in self.iris_rules:
                self._run_locally(job)
            else:
                self._submit(job, resources)
        except (IrisSettingError, IrisSubmitError) as error:
            self.report_job_error(SubmittedJobInfo(job), msg=str(error))

    def _submit(self, job: JobExecutorInterface, resources: dict[str, Any]) -> None:
        place = placement(resources, job.threads, self.defaults)
        wildcards = {} if job.is_group() else dict(job.wildcards_dict)  # type: ignore[attr-defined]
        name = job_name(job.name, wildcards, job.attempt, [storage_uri(o) for o in job.output])
        step = self.format_job_exec(job)
        command = step
        if place.is_gang and job.restart_times > 0:
            raise IrisSettingError(
                f"retries of rule {job.name}",
                job.restart_times,
                "gangs are retried by Iris as a whole (iris_max_retries / --iris-max-retries); a Snakemake retry would "
                "rerun the step inside the gang (rule-level retries) or resubmit it. Set retries to 0",
            )
        if place.is_gang:
            launch = None if job.is_group() else getattr(job.input, "launch", None)
            command = gang_command(
                python=self.get_python_executable(),
                nodes=place.replicas,
                gang_id=uuid.uuid4().hex[:12],
                step=step,
                launch=storage_uri(launch) if launch else None,
                rendezvous_root=None if launch else self._rendezvous_root(),
                join_timeout_s=self.settings.join_timeout,
            )
        submission = Submission(
            command=in_bundle(command) if self.bundled else shell(os.getcwd(), command),
            env=task_env(os.environ, self.envvars(), self.extra_env),
            ports=list(RAY_PORT_NAMES) if place.is_gang else [],
            scheduling_timeout_s=self.settings.scheduling_timeout,
            cpu_pool=self.settings.cpu_pool,
            bundled=self.bundled,
            image=runtime_image(resources),
            extras=runtime_extras(resources),
        )
        job_id, adopted = self.iris.submit(name, place, submission)
        what = f"{place.replicas}-node gang" if place.is_gang else "job"
        if adopted:
            self.logger.info(f"Found Iris {what} {job_id.to_wire()} submitted earlier for {job.name}; following it")
        else:
            self.logger.info(f"Submitted {job.name} to Iris as {what} {job_id.to_wire()}")
        self.report_job_submission(
            SubmittedJobInfo(
                job, external_jobid=job_id.to_wire(), aux={"job_id": job_id, "name": name, "gang": place.is_gang}
            )
        )

    def _rendezvous_root(self) -> str:
        if self.settings.rendezvous_root:
            return self.settings.rendezvous_root
        storage = self.workflow.storage_settings
        if storage.default_storage_provider and storage.default_storage_prefix:
            return f"{storage.default_storage_prefix.rstrip('/')}/.iris/rendezvous"
        return str(self.log_dir / "rendezvous")

    def _run_locally(self, job: JobExecutorInterface) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"local-{job.name}-{job.jobid}.log"
        with open(log, "wb") as handle:
            process = subprocess.Popen(
                self.format_job_exec(job), shell=True, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.logger.info(f"Running {job.name} locally (not in --iris-rules), log {log}")
        self.report_job_submission(
            SubmittedJobInfo(job, external_jobid=f"local:{process.pid}", aux={"process": process, "log": log})
        )

    # Status

    async def check_active_jobs(self, active_jobs: list[SubmittedJobInfo]) -> AsyncGenerator[SubmittedJobInfo, None]:
        remote = [info for info in active_jobs if "process" not in info.aux]
        for info in active_jobs:
            if "process" in info.aux:
                local = self._local_outcome(info)
                if local is not None:
                    yield local
        states = await self._states(remote)
        for info in remote:
            # No answer: ask again next round. A job Iris does not know, or a state this client does not know
            # (UNKNOWN), has not succeeded and is not running: a failure.
            phase = states[info.aux["job_id"].to_wire()].phase if states is not None else Phase.RUNNING
            if phase.alive:
                yield info
            elif phase is Phase.SUCCEEDED:
                forget_directory_probes(info.job)
                self.report_job_success(info)
            else:
                await self._report_failure(info)
        if self.settings.status_interval is not None:
            self.next_seconds_between_status_checks = self.settings.status_interval

    async def _states(self, remote: list[SubmittedJobInfo]) -> dict[str, JobState] | None:
        """Every active Iris job's state in one call (GetJobState takes a list, as one sacct serves the Slurm
        plugin); None when the controller did not answer (a restart): the jobs are asked about again next round."""
        if not remote:
            return {}
        async with self.status_rate_limiter:
            try:
                jobs = [i.aux["job_id"].to_wire() for i in remote]
                return await asyncio.to_thread(self.scheduler.job_states, jobs)
            except SchedulerUnavailableError as error:
                self.logger.warning(f"{error}; retrying at the next status check")
                return None

    def _local_outcome(self, info: SubmittedJobInfo) -> SubmittedJobInfo | None:
        """The job itself while its local process runs; None once it ended (and was reported)."""
        code = info.aux["process"].poll()
        if code is None:
            return info
        if code == 0:
            forget_directory_probes(info.job)
            self.report_job_success(info)
        else:
            log = info.aux["log"]
            self.report_job_error(info, msg=f"local job exited with code {code}; log {log}", aux_logs=[log])
        return None

    async def _report_failure(self, info: SubmittedJobInfo) -> None:
        await asyncio.sleep(LOG_LAG_S)
        async with self.status_rate_limiter:
            summary, logs = await asyncio.to_thread(
                self.iris.failure_report, info.aux["job_id"], self.settings.log_tail
            )
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{info.aux['name']}.log"
        summary, logs = redact_text(summary), redact_text(logs)
        path.write_text(f"{summary}\n{logs}\n")
        self.report_job_error(info, msg=f"{summary}\n{logs}", aux_logs=[str(path)])

    # Cancellation

    def cancel_jobs(self, active_jobs: list[SubmittedJobInfo]) -> None:
        """Snakemake stops (Ctrl-C): local jobs stop; Iris jobs are cancelled, except running gangs under
        `--iris-on-interrupt keep` (the default), which train on and write their outputs; a later run adopts them."""
        kept = []
        for info in active_jobs:
            if "process" in info.aux:
                _kill_group(info.aux["process"])
            elif info.aux.get("gang") and self.settings.on_interrupt == "keep":
                kept.append(info.external_jobid)
            else:
                self.iris.cancel(info.aux["job_id"])
                self.logger.info(f"Cancelled Iris job {info.external_jobid}")
        for job in kept:
            self.logger.warning(
                f"Left Iris gang {job} running (--iris-on-interrupt keep): it keeps training and writes its outputs; "
                f"run the same snakemake command again to follow it, or stop it with `iris job cancel {job}` "
                "(or `rlbuild cancel`). --iris-on-interrupt cancel stops gangs on Ctrl-C instead."
            )

    def shutdown(self) -> None:
        super().shutdown()
        self.iris.close()


def forget_directory_probes(job: JobExecutorInterface) -> None:
    """snakemake-storage-plugin-s3 0.3.6 caches `is_dir() == False` from the DAG-time probe of a directory output
    that did not exist yet, so the main process never sees the directory the job uploaded (only a HEAD of the
    key itself is retried). Forget that probe once the job has succeeded."""
    for path in job.output:
        storage_object = getattr(path, "storage_object", None) if getattr(path, "is_storage", False) else None
        if storage_object is not None and hasattr(storage_object, "_is_dir"):
            storage_object._is_dir = None


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [n for n in re.split(r"[,\s]+", text) if n]


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
