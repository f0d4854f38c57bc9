"""Iris as rlbuild sees it (`IrisScheduler`): job states and cancelling over the controller's Connect-RPC JSON
(`rpc.py`, no client library: status and the gang bootstrap never import it), a gang task's rank, attempt and
ports from Iris's variables, and the hooks the plan and the coordinator use."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlbuild.core.wire import RAY_PORT_NAMES
from rlbuild.job.rendezvous import GangTaskError, TaskIdentity
from rlbuild.schedulers.base import (
    AddressOption,
    CoordinatorRequest,
    JobRequest,
    JobState,
    NodeSize,
    Phase,
    PlanFacts,
    Scheduler,
    SchedulerUnavailableError,
)
from rlbuild.schedulers.iris import plan, rpc
from rlbuild.schedulers.iris.rpc import GET_JOB_STATE, NO_CONTROLLER, TERMINATE_JOB, UNKNOWN_JOB, phase, state_words


class IrisScheduler(Scheduler):
    name = "iris"
    title = "Iris"
    settings_model = plan.IrisSettings
    variable_prefixes = ("IRIS_",)
    address_option = AddressOption("--iris-controller-url", "SNAKEMAKE_IRIS_CONTROLLER_URL", "Iris controller")
    runs_coordinators = True
    bundle_table = ("tool", "iris", "bundle")  # what the Iris client leaves out of a job's workspace bundle

    @classmethod
    def owns_resource(cls, resource: str) -> bool:
        return resource.startswith(plan.PREFIX)

    @classmethod
    def rule_resources(cls, settings: Any, request: JobRequest) -> dict[str, int | str]:
        return plan.rule_resources(settings, request)

    @classmethod
    def node_sizes(cls, settings: Any) -> list[NodeSize]:
        return plan.node_sizes(settings)

    @classmethod
    def plan_section(cls, settings: Any, facts: PlanFacts) -> dict[str, Any]:
        return plan.plan_section(settings)

    @classmethod
    def plan_lines(cls, section: dict[str, Any], facts: PlanFacts) -> list[str]:
        return plan.plan_lines(section)

    @classmethod
    def job_of(cls, environ: Mapping[str, str]) -> str | None:
        """The job of `IRIS_TASK_ID` (`/<user>/<job>/<index>:<attempt>`)."""
        return environ.get("IRIS_TASK_ID", "").rpartition("/")[0] or None

    @classmethod
    def for_task(cls, environ: Mapping[str, str]) -> IrisScheduler | None:
        """Every Iris task has `IRIS_TASK_ID` and `IRIS_CONTROLLER_URL`."""
        return cls(environ.get("IRIS_CONTROLLER_URL") or None) if "IRIS_TASK_ID" in environ else None

    def job_states(self, jobs: Sequence[str]) -> dict[str, JobState]:
        if not self.address:
            return {job: JobState(Phase.UNKNOWN, note=NO_CONTROLLER) for job in jobs}
        words = state_words(rpc.post(self.address, GET_JOB_STATE, {"jobIds": list(jobs)})) if jobs else {}
        return {
            job: JobState(phase(words[job]), words[job]) if job in words else JobState(Phase.UNKNOWN, note=UNKNOWN_JOB)
            for job in jobs
        }

    def cancel(self, job: str) -> None:
        """TerminateJob: the job and its children (the jobs a coordinator submitted)."""
        if not self.address:
            raise SchedulerUnavailableError(f"{NO_CONTROLLER}: cannot cancel {job}")
        rpc.post(self.address, TERMINATE_JOB, {"jobId": job})

    def task(self, environ: Mapping[str, str]) -> TaskIdentity:
        """`IRIS_TASK_ID` = `/<user>/<job>/<index>:<attempt>`: the index is the rank."""
        task_id = environ.get("IRIS_TASK_ID", "")
        job, sep, tail = task_id.rpartition("/")
        index, colon, attempt = tail.partition(":")
        if not sep or not job or not index.isdigit() or (colon and not attempt.isdigit()):
            raise GangTaskError(
                f"IRIS_TASK_ID={task_id!r} is not '/<user>/<job>/<index>:<attempt>'; run the bootstrap as an Iris task"
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

    def submit_coordinator(self, request: CoordinatorRequest) -> tuple[str, bool]:
        from rlbuild.schedulers.iris import coordinator

        return coordinator.submit(self._address(), request)

    def coordinators(self, experiment_root: str) -> list[dict[str, Any]]:
        from rlbuild.schedulers.iris import coordinator

        return coordinator.following(experiment_root, self)

    def cancel_coordinators(self, experiment_root: str, targets: list[str]) -> list[str]:
        from rlbuild.schedulers.iris import coordinator

        self._address()
        return coordinator.cancel(experiment_root, self, targets)

    def _address(self) -> str:
        if not self.address:
            raise SchedulerUnavailableError(NO_CONTROLLER)
        return self.address

    def refuse_retry(self, environ: Mapping[str, str], log: Callable[[str], None]) -> None:
        """Cancel this task's own job, so Iris does not restart the gang into the same failure. The notice goes out
        first: the cancel kills this task (SIGTERM), often before a line written after it could be shipped."""
        job = self.job_of(environ)
        if not self.address or not job:
            return
        log(f"cancelling Iris job {job}: a retry would fail the same way")
        try:
            self.cancel(job)
        except SchedulerUnavailableError as error:
            log(f"could not cancel Iris job {job}, so Iris may retry it: {error}")
