"""Every scheduler rlbuild knows, by name, and which one runs this process."""

from __future__ import annotations

from collections.abc import Mapping

from rlbuild.core.errors import RlbuildError
from rlbuild.schedulers.base import Scheduler
from rlbuild.schedulers.iris import IrisScheduler
from rlbuild.schedulers.local import Local
from rlbuild.schedulers.slurm import Slurm

SCHEDULERS: dict[str, type[Scheduler]] = {cls.name: cls for cls in (Local, IrisScheduler, Slurm)}
NAMES: tuple[str, ...] = tuple(SCHEDULERS)
# Asked in this order which one runs this process: Iris's task variables win (an Iris worker may itself run inside
# a Slurm allocation); a process neither started is a local one.
TASK_ORDER: tuple[type[Scheduler], ...] = (IrisScheduler, Slurm, Local)


class UnknownSchedulerError(RlbuildError):
    """A scheduler name rlbuild has no module for."""

    def __init__(self, name: str, where: str) -> None:
        super().__init__(f"{where}: unknown scheduler {name!r}; rlbuild knows {', '.join(map(repr, NAMES))}")


def scheduler_for(name: str, address: str | None = None, *, where: str = "scheduler") -> Scheduler:
    """The scheduler of this name, answering at `address` (Iris: the controller URL; others need none)."""
    cls = SCHEDULERS.get(name)
    if cls is None:
        raise UnknownSchedulerError(name, where)
    return cls(address)


def task_scheduler(environ: Mapping[str, str]) -> Scheduler:
    """The scheduler whose task this process is, from its environment."""
    return next(found for cls in TASK_ORDER if (found := cls.for_task(environ)) is not None)  # Local: always
