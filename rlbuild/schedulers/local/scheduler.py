"""A local run as a scheduler: Snakemake's own executor runs every job as its child, so there is no scheduler job
to ask about or cancel (Ctrl-C stops the run, rlbuild/job/interrupts.py) and no gang (the trainer starts a private
Ray on this machine)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rlbuild.job.rendezvous import GangTaskError, TaskIdentity
from rlbuild.schedulers.base import JobState, Phase, Scheduler, SchedulerUnavailableError

NO_JOB = "no scheduler job (a local run)"
NOT_A_TASK = (
    "this process is no scheduler's task (its environment names no task of a scheduler rlbuild knows); "
    "run the bootstrap as a task of a cluster scheduler's job"
)


class Local(Scheduler):
    name = "local"
    title = "local"

    @classmethod
    def for_task(cls, environ: Mapping[str, str]) -> Local:
        """Every process not started by a scheduler is a local one."""
        return cls()

    def job_states(self, jobs: Sequence[str]) -> dict[str, JobState]:
        return {job: JobState(Phase.UNKNOWN, note=NO_JOB) for job in jobs}

    def cancel(self, job: str) -> None:
        raise SchedulerUnavailableError(f"{NO_JOB}: {job!r} cannot be cancelled; stop the run with Ctrl-C")

    def task(self, environ: Mapping[str, str]) -> TaskIdentity:
        raise GangTaskError(NOT_A_TASK)

    def gang_ports(self, environ: Mapping[str, str], rank: int) -> dict[str, int]:
        raise GangTaskError(NOT_A_TASK)
