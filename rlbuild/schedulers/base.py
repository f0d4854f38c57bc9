"""The seam between rlbuild and a scheduler: one small interface, implemented once per scheduler (a local run,
Iris, Slurm: `rlbuild/schedulers/local.py`, `iris.py`, `slurm.py`; `registry.py` finds one by name).

What the rest of rlbuild asks of a scheduler, and nothing more: the state of a recorded job id (the scheduler's
own word for it and what that word means, as a `Phase`), cancelling a job, and what a gang member learns from its
task's environment (which job, rank and attempt it is, the ports and address it offers its peers) and whether it
must stop the scheduler from restarting its job. Submitting is each scheduler's own business (the Iris client in
`iris.py`, Slurm's official executor plugin, Snakemake's local executor).
"""

from __future__ import annotations

import socket
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import ClassVar

from rlbuild.core.errors import RlbuildError


class SchedulerUnavailableError(RlbuildError):
    """The scheduler did not answer."""


class GangTaskError(RlbuildError):
    """This process cannot take its part in a gang: its environment does not say which task of which scheduler job
    it is, or it found no ports to offer its peers."""


class Phase(Enum):
    """What a scheduler's word for a job's state means to rlbuild."""

    PENDING = "pending"  # not started yet: queued, being scheduled, its environment being built, requeued
    RUNNING = "running"  # started and not ended (also suspended or completing)
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # ended without success: failed, cancelled, killed, timed out, out of memory, ...
    UNKNOWN = "unknown"  # the scheduler does not know the job, was not asked, or answered a word not mapped here

    @property
    def ended(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)

    @property
    def alive(self) -> bool:
        return self in (Phase.PENDING, Phase.RUNNING)


@dataclass(frozen=True)
class JobState:
    """One job as its scheduler reports it: the scheduler's own word (lower-case: Iris's `killed`, Slurm's
    `timeout`), what it means, and, where there is no word, why."""

    phase: Phase
    word: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class TaskIdentity:
    """Which task of the gang this process is: its job, its rank, and the job's attempt (a fresh rendezvous each)."""

    job: str
    rank: int
    attempt: int
    scheduler: str


class Scheduler(ABC):
    """One scheduler as rlbuild sees it. `address` is where it answers (Iris: the controller URL; a local run and
    Slurm, whose commands are on PATH, need none)."""

    name: ClassVar[str]  # as recorded in a gang's head.json and as Snakemake's executor is named
    title: ClassVar[str]  # as a sentence names it
    # Jobs start with the submitting process's whole environment (Slurm's `sbatch --export=ALL`), so that process
    # must first cut its environment to what jobs may receive.
    inherits_submit_environment: ClassVar[bool] = False

    def __init__(self, address: str | None = None) -> None:
        self.address = address

    @classmethod
    @abstractmethod
    def for_task(cls, environ: Mapping[str, str]) -> Scheduler | None:
        """This scheduler, when this process runs as one of its tasks (its variables say so); else None."""

    @abstractmethod
    def job_states(self, jobs: Sequence[str]) -> dict[str, JobState]:
        """The state of every job asked about (a job the scheduler does not know is UNKNOWN, with a note), in as
        few calls as the scheduler allows. Raises SchedulerUnavailableError when the scheduler did not answer."""

    @abstractmethod
    def cancel(self, job: str) -> None:
        """Cancel a job (on Iris also the jobs it submitted)."""

    @abstractmethod
    def task(self, environ: Mapping[str, str]) -> TaskIdentity:
        """This process's job, rank and attempt, from its task's variables; GangTaskError where they say none."""

    @abstractmethod
    def gang_ports(self, environ: Mapping[str, str], rank: int) -> dict[str, int]:
        """The Ray ports (`wire.RAY_PORT_NAMES`) this rank listens on."""

    def advertise_host(self, environ: Mapping[str, str]) -> str:
        """The address this task's peers reach it at."""
        return socket.gethostbyname(socket.gethostname())

    def refuse_retry(self, environ: Mapping[str, str], log: Callable[[str], None]) -> None:
        """A failure a retry would meet again: stop the scheduler from restarting this task's job, logging what is
        done *before* doing it (stopping the job may kill this task). Nothing where it would not restart it anyway."""
        return  # neither a local task nor a Slurm step is restarted on its own
