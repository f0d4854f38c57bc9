"""Slurm as rlbuild sees it: a job's state from `squeue` (then `sacct`), `scancel`, and a gang task's rank,
attempt and ports from Slurm's variables. Submitting is the official `snakemake-executor-plugin-slurm`'s; what a
job asks of Slurm is `rlbuild/schedulers/slurm/plan.py`, one link of a chain `rlbuild/schedulers/slurm/chain.py`.

A gang's job is recorded as `slurm-<job id>` (its rendezvous folder and head.json name it so).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

from rlbuild.core.errors import Violation
from rlbuild.core.wire import RAY_PORT_NAMES
from rlbuild.job.rendezvous import GangTaskError, TaskIdentity
from rlbuild.schedulers.base import (
    Gang,
    JobRequest,
    JobState,
    NodeSize,
    Phase,
    PlanFacts,
    Scheduler,
    SchedulerUnavailableError,
    TrainLimits,
)
from rlbuild.schedulers.slurm import plan

JOB_PREFIX = "slurm-"
QUERY_TIMEOUT_S = 10
# Slurm gives a task no ports: rank r takes free ones in its own band, below the Ray worker ports
# (rlbuild/job/gang.py) and the kernel's ephemeral range.
PORT_BASE = 15000
PORT_BAND = 500
PORT_BANDS = 10
# Slurm's job state codes (squeue's %T, sacct's State), lower-case.
PHASES = {
    **dict.fromkeys(
        ("pending", "configuring", "requeued", "requeue_fed", "requeue_hold", "resv_del_hold", "special_exit"),
        Phase.PENDING,
    ),
    **dict.fromkeys(
        ("running", "completing", "suspended", "stopped", "resizing", "signaling", "stage_out", "update_db"),
        Phase.RUNNING,
    ),
    "completed": Phase.SUCCEEDED,
    **dict.fromkeys(
        (
            "failed",
            "cancelled",
            "timeout",
            "node_fail",
            "out_of_memory",
            "preempted",
            "boot_fail",
            "deadline",
            "revoked",
        ),
        Phase.FAILED,
    ),
}
UNKNOWN_JOB = "squeue/sacct not available here or the job is unknown to Slurm"


def phase(word: str) -> Phase:
    return PHASES.get(word.lower(), Phase.UNKNOWN)


def state_word(stdout: str) -> str | None:
    """The state in the output of `squeue -h -o %T` or `sacct -n -X -P -o State` (`CANCELLED by 1000`: the
    first word), lower-case; None for no output."""
    words = stdout.split()
    return words[0].lower() if words else None


def job_state(job_id: str) -> JobState:
    """What `squeue` (a job it still lists: pending, running, or ended within MinJobAge), else `sacct` (accounting,
    where configured) says of one Slurm job."""
    for argv in (
        ["squeue", "-h", "--states=all", "-j", job_id, "-o", "%T"],
        ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
    ):
        if shutil.which(argv[0]) is None:
            continue
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        word = state_word(result.stdout) if result.returncode == 0 else None
        if word is not None:
            return JobState(phase(word), word)
    return JobState(Phase.UNKNOWN, note=UNKNOWN_JOB)


class Slurm(Scheduler):
    name = "slurm"
    title = "Slurm"
    settings_model = plan.SlurmSettings
    inherits_submit_environment = True  # the plugin submits with `sbatch --export=ALL`
    variable_prefixes = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
    sized_by_step_time = True  # a train chain's links and lead

    @classmethod
    def owns_resource(cls, resource: str) -> bool:
        return resource in plan.SLURM_ONLY

    @classmethod
    def rule_resources(cls, settings: Any, request: JobRequest) -> dict[str, int | str]:
        if settings is None:
            return {}
        if request.gang is None:
            return plan.cluster_resources(settings)
        return plan.gang_resources(settings, request.gang)

    @classmethod
    def node_sizes(cls, settings: Any) -> list[NodeSize]:
        return plan.node_sizes(settings) if settings is not None else []

    @classmethod
    def declared_step_time(cls, settings: Any) -> float | None:
        return settings.step_time_s if settings is not None else None

    @classmethod
    def problems(cls, settings: Any, facts: PlanFacts) -> list[Violation]:
        if settings is None:
            return []
        declared = settings.step_time_s  # a stated step time wins over one measured by an earlier run
        step_time = declared if declared is not None else facts.step_time_s
        return plan.check_chain(settings, facts.max_steps, facts.ckpt_interval, step_time)

    @classmethod
    def cluster_problems(cls, settings: Any, gang: Gang) -> list[Violation]:
        return plan.partition_problems(settings, gang) if settings is not None else []

    @classmethod
    def plan_section(cls, settings: Any, facts: PlanFacts) -> dict[str, Any] | None:
        return plan.plan_section(settings, facts) if settings is not None else None

    @classmethod
    def plan_lines(cls, section: dict[str, Any], facts: PlanFacts) -> list[str]:
        return plan.plan_lines(section, facts.max_steps)

    @classmethod
    def job_of(cls, environ: Mapping[str, str]) -> str | None:
        return environ.get("SLURM_JOB_ID") or None

    @classmethod
    def for_task(cls, environ: Mapping[str, str]) -> Slurm | None:
        """A task of a job step has `SLURM_PROCID`; the batch step that runs a Snakemake job has only `SLURM_JOB_ID`
        (`job_of`): it runs in a Slurm job without being one of a gang's tasks."""
        return cls() if "SLURM_PROCID" in environ else None

    def run_training(self, trainer_argv: Sequence[str], launch: str, attempts: str, limits: TrainLimits) -> int:
        """One link of a chain: the gang over srun, requeued until done (chain.py)."""
        from rlbuild.schedulers.slurm import chain

        return chain.run_link(launch, list(trainer_argv), limits.max_links, limits.stop_lead_s, os.environ, attempts)

    def job_states(self, jobs: Sequence[str]) -> dict[str, JobState]:
        return {job: job_state(job.removeprefix(JOB_PREFIX)) for job in jobs}

    def cancel(self, job: str) -> None:
        argv = ["scancel", job.removeprefix(JOB_PREFIX)]
        try:
            result = subprocess.run(argv, capture_output=True, text=True, timeout=QUERY_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as error:
            raise SchedulerUnavailableError(f"`{' '.join(argv)}` did not run: {error}") from error
        if result.returncode != 0:
            raise SchedulerUnavailableError(f"`{' '.join(argv)}` failed: {result.stderr.strip()}")

    def task(self, environ: Mapping[str, str]) -> TaskIdentity:
        """`SLURM_JOB_ID`, `SLURM_PROCID` and `SLURM_RESTART_COUNT` (the link of a requeued job; one task per node,
        so the rank is also `SLURM_NODEID`)."""
        values = {name: environ.get(name, "") for name in ("SLURM_JOB_ID", "SLURM_PROCID")}
        values["SLURM_RESTART_COUNT"] = environ.get("SLURM_RESTART_COUNT") or "0"
        bad = [f"{name}={value!r}" for name, value in values.items() if not value.isdigit()]
        if bad:
            raise GangTaskError(f"{', '.join(bad)}: not a Slurm task's numbers; run the bootstrap under srun")
        return TaskIdentity(
            job=f"{JOB_PREFIX}{values['SLURM_JOB_ID']}",
            rank=int(values["SLURM_PROCID"]),
            attempt=int(values["SLURM_RESTART_COUNT"]),
            scheduler=self.name,
        )

    def gang_ports(self, environ: Mapping[str, str], rank: int) -> dict[str, int]:
        """Free ports from a band of this rank's own (ranks sharing a host never race for a port); only the head's
        is published."""
        return free_ports(PORT_BASE + (rank % PORT_BANDS) * PORT_BAND)


def free_ports(low: int) -> dict[str, int]:
    """One port per Ray port name in [low, low + PORT_BAND), each free when taken (all held until the end)."""
    held: list[socket.socket] = []
    try:
        for port in range(low, low + PORT_BAND):
            probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                probe.bind(("", port))
            except OSError:
                probe.close()
                continue
            held.append(probe)
            if len(held) == len(RAY_PORT_NAMES):
                return dict(zip(RAY_PORT_NAMES, (h.getsockname()[1] for h in held), strict=True))
    finally:
        for probe in held:
            probe.close()
    raise GangTaskError(f"fewer than {len(RAY_PORT_NAMES)} free ports in {low}-{low + PORT_BAND - 1}")
