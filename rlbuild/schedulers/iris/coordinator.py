"""The detached coordinator: the graph itself runs as a small CPU Iris job, so the laptop may disconnect.

`rlbuild submit TARGET...` submits `snakemake --profile iris TARGET...` as one Iris job (seed 000: 4 CPU,
16 GB, 64 GB disk) and returns. Inside it, the Iris executor submits every job as a child of the coordinator,
so `rlbuild cancel` (Iris: cancel a job and its descendants) stops it and all its jobs at once. The job's name
is derived from the experiment root and the targets: a second submission of the same targets finds the
coordinator that runs (Iris answers for the name) and follows it instead of starting another. Each submission
leaves a record in storage, `<experiment root>/.coordinators/<name>.json`, which `rlbuild status` follows.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import shlex
import time
from typing import Any

from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError
from rlbuild.core.wire import forwarded
from rlbuild.schedulers.base import CoordinatorRequest, JobState, Phase, Scheduler, SchedulerUnavailableError
from rlbuild.schedulers.iris.client import Iris, IrisSubmitError, Placement, Submission, in_bundle

FOLDER = ".coordinators"
# The executor settings a coordinator's Snakemake reads from its environment.
IRIS_SETTINGS = ("SNAKEMAKE_IRIS_CLUSTER", "SNAKEMAKE_IRIS_CPU_POOL")


class CoordinatorError(RlbuildError):
    """A coordinator could not be submitted, found or cancelled."""


def coordinator_name(experiment_root: str, targets: list[str]) -> str:
    digest = hashlib.sha256("\n".join([experiment_root, *sorted(targets)]).encode()).hexdigest()[:10]
    experiment = "".join(c if c.isalnum() or c in "-." else "-" for c in experiment_root.rsplit("/", 1)[-1].lower())
    return f"rlbuild-{experiment[:30]}-{digest}"


def record_uri(experiment_root: str, name: str) -> str:
    return storage.join(experiment_root, FOLDER, f"{name}.json")


def command(targets: list[str], snakemake_args: list[str]) -> str:
    """What the coordinator runs, from its bundle of the checkout: the jobs it submits get bundles of their own."""
    # The profile by its folder: the root link `iris` is not a file a bundle carries.
    argv = ["python", "-m", "snakemake", *targets, "--profile", "profiles/iris", *snakemake_args]
    return " ".join(shlex.quote(a) for a in argv)


def submit(url: str, request: CoordinatorRequest) -> tuple[str, bool]:
    """Submit the coordinator with `request.repo` as its bundle, or find the one of these targets that runs.
    Returns (Iris job id, adopted). Nothing of this machine but the bundle and the environment hand-off reaches it."""
    experiment_root, targets, snakemake_args = request.experiment_root, request.targets, request.snakemake_args
    name = coordinator_name(experiment_root, targets)
    place = Placement(
        replicas=1,
        cpu=request.cpu,
        memory=request.memory,
        disk=request.disk,
        gpu_variant=None,
        gpus_per_node=0,
        priority="interactive",
        max_retries=0,  # a lost coordinator is resubmitted by hand: a second Snakemake would adopt its jobs anyway
        coschedule=None,
    )
    env = forwarded(os.environ) | {k: os.environ[k] for k in IRIS_SETTINGS if os.environ.get(k)}
    env["SNAKEMAKE_IRIS_CONTROLLER_URL"] = url
    sub = Submission(
        command=in_bundle(command(targets, snakemake_args)),
        env=env,
        ports=[],
        scheduling_timeout_s=1800,
        cpu_pool=request.pool or os.environ.get("SNAKEMAKE_IRIS_CPU_POOL"),
        bundled=True,
        image=request.image,
    )
    iris = Iris(url, workspace=request.repo)
    try:
        job_id, adopted = iris.submit(name, place, sub)
    except IrisSubmitError as error:
        raise CoordinatorError(str(error)) from error
    finally:
        iris.close()
    record = {
        "name": name,
        "job": job_id.to_wire(),
        "controller_url": url,
        "targets": targets,
        "snakemake_args": snakemake_args,
        "user": getpass.getuser(),
        "submitted_at": time.time(),
    }
    if not adopted:
        storage.write_json(record_uri(experiment_root, name), record)
    return job_id.to_wire(), adopted


def records(experiment_root: str) -> list[dict[str, Any]]:
    """Every coordinator submitted for this experiment root, newest first."""
    folder = storage.join(experiment_root, FOLDER)
    found = [storage.read_json(storage.join(folder, n)) for n in storage.list_names(folder) if n.endswith(".json")]
    return sorted((r for r in found if isinstance(r, dict)), key=lambda r: -float(r.get("submitted_at", 0)))


def following(experiment_root: str, iris: Scheduler) -> list[dict[str, Any]]:
    """The coordinators of this experiment root with their Iris state (one call), for `rlbuild status`."""
    found = records(experiment_root)
    if not found:
        return []
    jobs = [r["job"] for r in found]
    try:
        states = iris.job_states(jobs)
    except SchedulerUnavailableError as error:
        states = {job: JobState(Phase.UNKNOWN, note=str(error)) for job in jobs}
    return [
        {
            "job": r["job"],
            "scheduler": iris.name,
            "targets": r.get("targets"),
            "job_state": states[r["job"]].word,
            "job_phase": states[r["job"]].phase.value,
            "job_state_note": states[r["job"]].note,
        }
        for r in found
    ]


def cancel(experiment_root: str, iris: Scheduler, targets: list[str]) -> list[str]:
    """Cancel the running coordinators of these targets (all of the experiment root's when none are given), and
    with them every job they submitted. Returns the cancelled job ids."""
    found = records(experiment_root)
    if targets:
        name = coordinator_name(experiment_root, targets)
        found = [r for r in found if r["name"] == name]
    states = iris.job_states([r["job"] for r in found])
    running = [r["job"] for r in found if states[r["job"]].phase.alive]
    for job in running:
        iris.cancel(job)
    return running
