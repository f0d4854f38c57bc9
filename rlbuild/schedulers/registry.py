"""Every scheduler rlbuild knows, by name: the one place that maps a name to a scheduler's package. Nothing else
names a scheduler; the rest of rlbuild asks the registry and the `Scheduler` interface (base.py)."""

from __future__ import annotations

from collections.abc import Mapping

from rlbuild.core.errors import RlbuildError
from rlbuild.schedulers.base import Scheduler
from rlbuild.schedulers.iris.scheduler import IrisScheduler
from rlbuild.schedulers.local.scheduler import Local
from rlbuild.schedulers.slurm.scheduler import Slurm

# In the order asked which one runs this process: Iris's task variables win (an Iris worker may itself run inside
# a Slurm allocation); a process no scheduler started is a local one, so Local comes last.
SCHEDULERS: dict[str, type[Scheduler]] = {cls.name: cls for cls in (IrisScheduler, Slurm, Local)}


class UnknownSchedulerError(RlbuildError):
    """A scheduler name rlbuild has no package for."""

    def __init__(self, name: str, where: str) -> None:
        super().__init__(f"{where}: unknown scheduler {name!r}; rlbuild knows {', '.join(map(repr, SCHEDULERS))}")


def cluster_names() -> str:
    """The names of the schedulers that run jobs on a cluster (each a profile), as a command line offers them."""
    return "|".join(name for name, cls in SCHEDULERS.items() if cls is not Local)


def bundle_settings() -> str:
    """Where pyproject.toml says what each scheduler's bundles leave out, as a sentence names them."""
    return ", ".join(f"[{'.'.join(cls.bundle_table)}]" for cls in SCHEDULERS.values() if cls.bundle_table) or "none"


def register(cls: type[Scheduler]) -> None:
    """Add a scheduler (asked before the local one which runs this process). Register before the experiment's
    model is first imported (rlbuild.plan.spec), which builds `execution`'s sections from this table."""
    local = SCHEDULERS.pop(Local.name)
    SCHEDULERS[cls.name] = cls
    SCHEDULERS[Local.name] = local


def scheduler_for(name: str, address: str | None = None, *, where: str = "scheduler") -> Scheduler:
    """The scheduler of this name, answering at `address` (a controller's URL, for a scheduler that has one)."""
    cls = SCHEDULERS.get(name)
    if cls is None:
        raise UnknownSchedulerError(name, where)
    return cls(address)


def task_scheduler(environ: Mapping[str, str]) -> Scheduler:
    """The scheduler whose task this process is, from its environment."""
    return next(found for cls in SCHEDULERS.values() if (found := cls.for_task(environ)) is not None)


def job_scheduler(environ: Mapping[str, str]) -> Scheduler:
    """The scheduler whose job this process runs in (a task of it, or its batch step; Local outside any)."""
    return next((cls() for cls in SCHEDULERS.values() if cls.job_of(environ)), Local())


def job_here(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """(scheduler, job) of the scheduler job this process runs in, or None outside any."""
    for cls in SCHEDULERS.values():
        job = cls.job_of(environ)
        if job:
            return cls.name, job
    return None


def executor_scheduler(executor: str) -> type[Scheduler] | None:
    """The scheduler whose jobs this Snakemake executor submits (None: a local or dry-run executor)."""
    return next((cls for cls in SCHEDULERS.values() if cls is not Local and cls.runs_under(executor)), None)


def resource_owner(resource: str) -> str | None:
    """The one scheduler whose executor alone reads this rule resource, if one does."""
    return next((name for name, cls in SCHEDULERS.items() if cls.owns_resource(resource)), None)
