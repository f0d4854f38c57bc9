"""The seam between rlbuild and a scheduler: one interface, implemented once per scheduler, each a package of its
own under `rlbuild/schedulers/`; `registry.py` is the one place that maps a name to one.

What the rest of rlbuild asks of a scheduler, and nothing more. Before anything runs (classmethods, on the
experiment's `execution.<name>` section, validated by the scheduler's `settings_model`): the resources it puts on
a rule, which of a rule's resources only its executor reads, the per-node sizes it asks for, its preflight
problems (and those only the scheduler itself can answer), and its lines in the plan. While a run goes: the state
of a recorded job id (the scheduler's own word and its `Phase`), cancelling a job, which job a process runs in,
what a gang member learns from its task's environment (its job, rank and attempt, the ports and address it offers
its peers), whether it must stop the scheduler from restarting its job, and how the train job runs the trainer.
Submitting is each scheduler's own business (its Snakemake executor plugin, Snakemake's local executor).
"""

from __future__ import annotations

import socket
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from rlbuild.core.errors import RlbuildError, Violation
from rlbuild.job.rendezvous import TaskIdentity

if TYPE_CHECKING:
    from pydantic import BaseModel


class SchedulerUnavailableError(RlbuildError):
    """The scheduler did not answer."""


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
    """One job as its scheduler reports it: the scheduler's own word (lower-case: `killed`, `timeout`), what it
    means, and, where there is no word, why."""

    phase: Phase
    word: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class TrainLimits:
    """How far one train job may go: jobs a chain may take, and seconds before a job's limit at which training
    hands over (read by the rule's command from the resources below, so that a rerun sees the experiment's
    current values)."""

    max_links: int = 1
    stop_lead_s: int = 0


# Resources the train rule's command reads (`--max-links`, `--stop-lead`): present under every executor.
COMMAND_RESOURCES: dict[str, int] = {"chain_max_links": 1, "chain_signal_lead_s": 0}


@dataclass(frozen=True)
class Gang:
    """The nodes the train job takes, in the experiment's words (its `topology`)."""

    num_nodes: int
    gpus_per_node: int
    gpu_variant: str  # `cpu`: CPU ranks, no GPU request


@dataclass(frozen=True)
class JobRequest:
    """What one rule's job asks of the scheduler that runs it: the train gang's whole nodes, or one export/eval
    task of `cpu` CPUs and `memory`; and, where the nodes do not share this checkout's .venv, the runtime they run
    (a pinned image, else a set-up of uv.lock with these extras)."""

    gang: Gang | None = None
    cpu: int | None = None
    memory: str | None = None
    image: str | None = None
    extras: tuple[str, ...] = ()


@dataclass(frozen=True)
class PlanFacts:
    """What a scheduler's checks and plan lines may need of a resolved experiment besides its own settings."""

    gang: Gang
    max_steps: int
    ckpt_interval: int
    step_time_s: float | None = None  # measured by an earlier run of this geometry, where one did


@dataclass(frozen=True)
class AddressOption:
    """How a command line reaches a scheduler that answers at an address: its flag, and the variable that gives
    the default (the one its executor plugin reads)."""

    flag: str
    variable: str
    what: str  # what answers there, as a sentence names it: "<name> controller"


@dataclass(frozen=True)
class CoordinatorRequest:
    """A detached coordinator (`rlbuild submit`): Snakemake itself as one small CPU job of the scheduler, running
    these targets with these arguments from a bundle of `repo`, so the submitting machine may disconnect."""

    experiment_root: str
    targets: list[str]
    snakemake_args: list[str]
    repo: Path
    image: str | None
    cpu: float = 4.0
    memory: str = "16GB"
    disk: str = "64GB"
    pool: str | None = None


@dataclass(frozen=True)
class NodeSize:
    """One per-node size a scheduler's settings ask for: the field that sets it, and the value."""

    field: str
    kind: str  # cpu, memory or disk
    value: float | str


class Scheduler(ABC):
    """One scheduler as rlbuild sees it. `address` is where it answers (a controller's URL; a scheduler whose
    commands are on PATH needs none)."""

    name: ClassVar[str]  # its `execution.<name>` section, as recorded in a gang's head.json, as its profile's executor
    title: ClassVar[str]  # as a sentence names it
    # The experiment's `execution.<name>` section (None: the scheduler takes no settings).
    settings_model: ClassVar[type[BaseModel] | None] = None
    # Jobs start with the submitting process's whole environment, so that process must first cut its environment to
    # what jobs may receive.
    inherits_submit_environment: ClassVar[bool] = False
    # Prefixes of the variables the scheduler sets in its tasks: an experiment may not set them, and a job keeps
    # them where its environment is cut.
    variable_prefixes: ClassVar[tuple[str, ...]] = ()
    # Its jobs end at a wall-clock limit, sized by the training's step time: the plan measures it from an earlier
    # run of the version where the settings state none.
    sized_by_step_time: ClassVar[bool] = False
    address_option: ClassVar[AddressOption | None] = None  # None: its commands need no address
    runs_coordinators: ClassVar[bool] = False  # it can run Snakemake itself as a detached job (`rlbuild submit`)
    # Its jobs run a bundle of the checkout: the pyproject.toml table whose `exclude` patterns the bundle leaves out.
    bundle_table: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, address: str | None = None) -> None:
        self.address = address

    # -- before anything runs --------------------------------------------------------------------------------------

    @classmethod
    def bundle_excludes(cls, project: Mapping[str, Any]) -> list[str]:
        """Patterns of files the scheduler leaves out of the checkout's bundle, from pyproject.toml (`project`):
        the `exclude` list of its `bundle_table`."""
        table: Any = project
        for key in cls.bundle_table or ():
            table = table.get(key, {}) if isinstance(table, Mapping) else {}
        return list(table.get("exclude", [])) if cls.bundle_table and isinstance(table, Mapping) else []

    @classmethod
    def runs_under(cls, executor: str) -> bool:
        """Whether this Snakemake executor (its plugin's name) submits this scheduler's jobs."""
        return executor.startswith(cls.name)

    @classmethod
    def owns_resource(cls, resource: str) -> bool:
        """A rule resource only this scheduler's executor reads (dropped under other executors)."""
        return False

    @classmethod
    def rule_resources(cls, settings: Any, request: JobRequest) -> dict[str, int | str]:
        """The resources this scheduler's executor reads for one rule's job."""
        return {}

    @classmethod
    def node_sizes(cls, settings: Any) -> list[NodeSize]:
        """The per-node sizes the settings ask for (checked against the largest node a profile declares, and
        written into the launch document's allocation)."""
        return []

    @classmethod
    def declared_step_time(cls, settings: Any) -> float | None:
        """Seconds per training step the settings state, where they state one."""
        return None

    @classmethod
    def problems(cls, settings: Any, facts: PlanFacts) -> list[Violation]:
        """What is wrong with the settings for this experiment, found without asking the scheduler."""
        return []

    @classmethod
    def cluster_problems(cls, settings: Any, gang: Gang) -> list[Violation]:
        """What the scheduler itself says is wrong (asked only by the submitting process; none where it does not
        answer)."""
        return []

    @classmethod
    def plan_section(cls, settings: Any, facts: PlanFacts) -> dict[str, Any] | None:
        """This scheduler's part of the plan as data (None: it adds nothing)."""
        return None

    @classmethod
    def plan_lines(cls, section: dict[str, Any], facts: PlanFacts) -> list[str]:
        """`plan_section`'s lines in the printed plan."""
        return []

    @classmethod
    def launch_settings(cls, settings: Any) -> dict[str, Any]:
        """What the launch document records of the settings."""
        return settings.model_dump(mode="json") if settings is not None else {}

    # -- while a run goes ------------------------------------------------------------------------------------------

    @classmethod
    def job_of(cls, environ: Mapping[str, str]) -> str | None:
        """The job this process runs in, as the scheduler names it (None: not one of its jobs)."""
        return None

    def submit_coordinator(self, request: CoordinatorRequest) -> tuple[str, bool]:
        """Submit a detached coordinator, or find the one of these targets that runs: (job id, adopted)."""
        raise SchedulerUnavailableError(f"{self.title} runs no detached coordinator")

    def coordinators(self, experiment_root: str) -> list[dict[str, Any]]:
        """The detached coordinators of this experiment root with their job state, newest first."""
        return []

    def cancel_coordinators(self, experiment_root: str, targets: list[str]) -> list[str]:
        """Cancel the running coordinators of these targets (all of the root's when none are given), and every job
        they submitted; the cancelled job ids."""
        return []

    def run_training(self, trainer_argv: Sequence[str], launch: str, attempts: str, limits: TrainLimits) -> int:
        """Run the trainer for the train job of this process: in its own supervised session here (its Ray ends
        with it); a scheduler whose job must cross a wall-clock limit does more."""
        from rlbuild.job import interrupts  # the process supervision only the train job needs
        from rlbuild.job.attempt import run_logged

        with interrupts.supervised() as env:
            return run_logged([sys.executable, "-m", "trainer", *trainer_argv], attempts, env)

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
        """Cancel a job (and, where the scheduler nests jobs, the jobs it submitted)."""

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
        return  # a scheduler that does not restart a failed task on its own has nothing to stop
