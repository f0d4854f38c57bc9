"""`rlbuild status`: what storage (and, for a running job, the scheduler) says about every artifact of a version.

Each artifact is in one state, and a state is only claimed on evidence:

- `done`: its record is stored, matches the configuration, and is no older than the record of every artifact it
  is built from (BUILT_FROM, the rules' inputs), each `done` too, whose identity it names in `deps`.
- `stale`: a record from another configuration, or one Snakemake would rebuild because something it is built
  from was rebuilt after it (a newer `created_at`: Snakemake's mtime trigger, read from the records; for train,
  the time its terminal's checkpoint was saved, as Snakemake's checksum of terminal.json sees a re-emission), now
  names another identity, or is itself not `done`. The reason names that artifact.
- `running`: a live process or the scheduler confirms its job runs. For train: the trainer's own process (its
  `progress.json` names host and pid; on this host the pid is asked), the gang's scheduler job, ranks alive in the
  rendezvous, or a trainer on another host that published a step within the stall threshold. For every other
  kind: a process under the lease holder (on this host) whose command line writes the artifact's record (every
  rule's shell passes `--record <record>`).
- `leased`: a live run holds its lease but nothing confirms its job started: it waits behind what it is built
  from, or runs where status cannot see (a remote executor's export or eval job publishes nothing).
- `failed`: its last attempt ended badly, its gang's scheduler job ended, or the run that leased it is gone
  (owner gone): its process is gone from this host (`lease.holder_is_gone`), its heartbeat is older than
  `lease.STALE_S`, or the scheduler job it ran in ended. A fresh heartbeat never outweighs a dead owner.
- `interrupted` (train): its last attempt stopped on an interrupt (exit 130) after checkpointing the step under
  way; a rerun resumes there. It has no ETA: nothing runs.
- `corrupt`: its record, or a control document the record describes (launch.yaml, terminal.json, metrics.jsonl,
  a manifest, results.json), changed after it was written (rlbuild/contracts/artifacts.py); the verdict names the
  file. Nothing below it is believed done. With `--verify`, a train whose checkpoint (terminal.json's, else the
  latest) has a file that is not what its manifest lists (a flipped `*.distcp` shard) is `corrupt` too.
- `missing`: nothing of it is stored and nobody builds it.

A train that is not done also gets the monitoring ladder (seed 003): the scheduler's job state and attempt, ranks
that materialised their inputs, Ray nodes alive N/N, engine throughput, where it resumed, the last step and its
age, steps/min and ETA, the last checkpoint, restarts, and the redacted tail of the failure. The last step is the
newest of the metric stream, `progress.json` and the latest checkpoint's `trainer_state.json`, so the checkpoint
shown never runs ahead of it; steps/min and ETA come from the trainer's own rate (its attempt's steps over the
attempt's wall time, as its progress line computes it), else from the metric stream's step times. The verdict is
one line a person can act on; a failed detached coordinator makes it `failed` naming the job. Everything comes
from what the gang and the trainer publish in storage (rlbuild/contracts/progress.py), the scheduler, and, for
a run on this very host, its process table: no node is asked.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psutil

from rlbuild.contracts import checkpoints
from rlbuild.contracts.artifacts import (
    ARTIFACTS,
    KINDS,
    CorruptDocumentError,
    artifact,
    experiment_root,
    is_mutable,
    key_of_target,
    kind_of_target,
)
from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.manifest import ManifestError, ManifestMismatchError, read_manifest, verify_stored
from rlbuild.contracts.metricstream import attempt_starts, parse_lines, read_run_metrics, used_gpu_hours
from rlbuild.contracts.progress import HEARTBEAT_S, read_progress
from rlbuild.core import storage, streams
from rlbuild.core.errors import RlbuildError
from rlbuild.core.inventory import Inventory
from rlbuild.core.redact import redact_text
from rlbuild.core.wire import INTERRUPTED_EXIT_CODE
from rlbuild.job.attempt import log_uri
from rlbuild.job.rendezvous import Rendezvous
from rlbuild.ops.lease import STALE_S, broken_text, describe, holder_is_gone, leases_and_breaks
from rlbuild.plan import series
from rlbuild.plan.identity import record_drift
from rlbuild.plan.resolve import Plan, resolve_checked
from rlbuild.plan.spec import Execution, Experiment
from rlbuild.plan.versioning import StoredRecords, read_ahead
from rlbuild.schedulers.base import Phase, SchedulerUnavailableError
from rlbuild.schedulers.registry import SCHEDULERS, UnknownSchedulerError, scheduler_for

# Without a measured step time, a training is stalled after 10 minutes without a step; with one, after
# STALL_STEPS steps' worth (checkpoints and evals take a few steps' time), never under STALL_FLOOR_S.
STALL_AFTER_S = 600.0
STALL_STEPS = 20
STALL_FLOOR_S = 60.0
# An agent run starves when its episodes stop finishing though its steps have not yet stopped (a step waits on
# sandboxes that do not answer): stalled once the batches in play finished no episode for the experiment's
# `execution.episode_stall_after_s` (default EPISODE_STALL_AFTER_S), or once at least MIN_ENDED_FOR_RATE episodes
# ended since they began and SANDBOX_ERROR_RATE of them failed (trainer/agents/episodes.py SANDBOX_ERRORS).
EPISODE_STALL_AFTER_S: float = Execution.model_fields["episode_stall_after_s"].default  # 12 minutes
SANDBOX_ERROR_RATE = 0.5
MIN_ENDED_FOR_RATE = 8
TAIL_LINES = 20
RECENT_STEPS = 10  # steps averaged for steps/min, ETA and engine throughput
# An OSError as Python prints it: `[Errno 28] No space left on device: '<path>'`.
OS_ERROR = re.compile(r"\[Errno (\d+)\] [^:]*: '([^']*)'")
WRITE_REFUSALS = {
    errno.ENOSPC: "no space left on device writing {path}",
    errno.EDQUOT: "disk quota exceeded writing {path}",
    errno.EROFS: "read-only file system at {path}",
    errno.EACCES: "permission denied on {path}",
    errno.EPERM: "operation not permitted on {path}",
}
EXITED = re.compile(r"\[rlbuild\] attempt \S+ exited with code (-?\d+)")
Entry = dict[str, Any]


@dataclass(frozen=True)
class Options:
    stall_after_s: float | None = None  # None: from the measured step time (stall_threshold)
    # Where each scheduler that answers at an address does (a controller's URL), by name (absent: storage only).
    addresses: dict[str, str] = field(default_factory=dict)
    verify: bool = False  # read every file of train's checkpoint against its manifest (`rlbuild status --verify`)


def gather(
    experiment: Experiment, versions: list[str], storage_root: str, kinds: list[str] | None, opts: Options
) -> Entry:
    """The status document: `{"experiment", "storage_root", "versions": {v: {kind: {"state", ...}}}}`."""
    now = time.time()
    storage_root = unscoped(storage_root, experiment.name)
    root = experiment_root(storage_root, experiment.name)
    inventory = Inventory(root)  # one listing per folder answers every version's records
    inventory.list_ahead()  # while the leases are listed
    leases, breaks = leases_and_breaks(root)
    checked = series.check(experiment)  # once: every version's plan is of this experiment
    keys = series.expand(checked, versions)  # a series' version: each of its arms
    read_ahead(inventory, keys)
    found: Entry = {}
    for version in keys:
        try:
            plan = resolve_checked(checked, version, storage_root, starts_jobs=False)  # status starts nothing
        except RlbuildError as error:
            found[version] = {"error": redact_text(str(error))}
            continue
        found[version] = version_status(plan, leases, kinds, opts, now, inventory)
        for kind, entry in found[version].items():
            if isinstance(entry, dict) and (recorded := breaks.get(f"{kind}/v{version}")):
                entry["lease_broken"] = broken_text(recorded[-1])  # the last break: who freed it, when, from whom
    coordinators = following(root, opts)
    document = {"experiment": experiment.name, "storage_root": storage_root, "versions": found}
    return document | {"coordinators": coordinators, "verdict": overall(found, coordinators)}


def unscoped(storage_root: str, experiment: str) -> str:
    """The storage root above the experiment root, read as Snakemake's storage scoping reads a default storage
    prefix (rlbuild/workflow.py:scope_storage): one that already ends in the experiment's name is its root."""
    if "://" in storage_root and storage_root.rstrip("/").endswith(f"/{experiment}"):
        return storage_root.rstrip("/")[: -len(experiment) - 1]
    return storage_root


def overall(versions: Entry, coordinators: list[Entry] | None = None) -> str:
    """One line for the whole selection: a failure first (an artifact's or a detached coordinator's), then the
    train's verdict where one runs, then what runs, waits or is left to build."""
    unresolved = [version for version, kinds in versions.items() if "error" in kinds]
    if unresolved:
        return f"invalid: version {', '.join(unresolved)} cannot be resolved (the error is above)"
    shown = {(v, k): e for v, kinds in versions.items() for k, e in kinds.items() if isinstance(e, dict)}
    entries = list(shown.values())
    for word in ("corrupt", "failed", "interrupted"):
        for entry in entries:
            if str(entry.get("verdict", "")).startswith(word):
                return str(entry["verdict"])
    for coordinator in coordinators or []:
        if coordinator.get("job_phase") == Phase.FAILED.value and not _targets_done(coordinator, shown):
            targets = " ".join(coordinator.get("targets") or [])
            job = f"{title(coordinator.get('scheduler'))} job {coordinator['job']}"
            return f"failed: coordinator {job} is {coordinator.get('job_state')} ({targets})"
    for word in ("stalled", "degraded", "healthy", "starting"):
        for entry in entries:
            if str(entry.get("verdict", "")).startswith(word):
                return str(entry["verdict"])
    if any(e["state"] == "running" for e in entries):
        return "running"
    if any(e["state"] == "leased" for e in entries):
        waiting = ", ".join(artifact(k).version_folder(v) for (v, k), e in shown.items() if e["state"] == "leased")
        return f"leased: {waiting} held by a live run; nothing confirms their jobs started"
    missing = [e for e in entries if e["state"] not in ("done", "stale")]
    stale = [
        f"{k} ({e.get('stale_because') or 'another configuration'})"
        for (_, k), e in shown.items()
        if e["state"] == "stale"
    ]
    if not missing and not stale:
        return "done" if entries else "0 of 0 artifacts not built"
    parts = [f"{len(missing)} of {len(entries)} artifacts not built"] if missing else []
    return "; ".join(parts + ([f"stale: {', '.join(stale)}"] if stale else []))


def _targets_done(coordinator: Entry, shown: dict[tuple[str, str], Entry]) -> bool:
    """Every target of the coordinator is shown here and done: its failure was repaired since (a later run)."""
    wanted = []
    for target in coordinator.get("targets") or []:
        kind, key = kind_of_target(target), key_of_target(target)
        if kind is None or key is None:
            return False
        wanted.append((key, kind))
    return bool(wanted) and all(shown.get(key, {}).get("state") == "done" for key in wanted)


# What each artifact is built from: the artifact inputs of its rule (rules/*.smk), which Snakemake's mtime trigger
# compares against the rule's outputs (tests/spine/test_status_units.py checks this against the rules).
BUILT_FROM: dict[str, tuple[str, ...]] = {
    "stage_model": ("base_model",),
    "launch": ("stage_model", "stage_data"),
    "train": ("launch", "stage_model", "stage_data"),
    "export": ("launch", "train", "stage_model", "stage_data"),
    "eval": ("launch", "export", "stage_data"),
}


def version_status(
    plan: Plan,
    leases: dict[str, Entry],
    kinds: list[str] | None,
    opts: Options,
    now: float,
    inventory: Inventory | None = None,
) -> Entry:
    stored = StoredRecords(plan, inventory)
    corrupt = stored.corrupt()  # a record or a document it describes edited since: believe neither

    def read(kind: str) -> Entry | None:
        return None if kind in corrupt else stored.read(kind)

    stale, drifts = record_drift(plan.records, read)
    entries: Entry = {}
    for a in ARTIFACTS:
        if a.kind not in plan.records or (kinds is not None and a.kind not in kinds):
            continue
        key = plan.key_of(a.kind)  # a series' arm may use a shared stage of the plain version or another arm
        entry: Entry = {"uri": plan.uri(a.path(key))}
        record = read(a.kind)
        if a.kind in corrupt:
            entry |= {"state": "corrupt", "verdict": f"corrupt: {corrupt[a.kind]}"}
        elif record is not None:
            changed = a.kind in drifts or (is_mutable(plan.version) and a.kind in stale)
            entry |= {"state": "stale" if changed else "done", "built_at": record.get("created_at")}
            if a.kind in drifts:
                entry["changed"] = sorted(drifts[a.kind])
            elif not changed and (why := outdated_by(plan, a.kind, record, entries, read)):
                entry |= {"state": "stale", "stale_because": why}
        else:
            entry |= lease_state(leases.get(f"{a.kind}/v{key}"), now, opts, a.record(key))
            if entry["state"] == "leased" and (waits := unbuilt_input(plan, a.kind, entries)):
                entry["verdict"] = f"leased: a live run holds it; its job waits for {waits[0]} ({waits[1]})"
        if a.kind == "train" and opts.verify and entry["state"] != "corrupt" and (bad := checkpoint_problem(plan)):
            entry |= {"state": "corrupt", "verdict": f"corrupt: {bad}"}
        if a.kind == "train" and entry["state"] not in ("done", "corrupt"):
            entry |= train_ladder(plan.launch, entry, opts, now, plan.experiment.execution.episode_stall_after_s)
        if a.kind == "train" and entry["state"] == "done":
            entry["gpu_hours"] = gpu_hours_used(plan, stored)
        entries[a.kind] = entry
    return entries


def outdated_by(
    plan: Plan, kind: str, record: Entry, entries: Entry, read: Callable[[str], Entry | None]
) -> str | None:
    """Why Snakemake would rebuild an artifact whose own record is current: something it is built from is not
    done, names another identity than the one its record was built from, or was made after it."""
    unbuilt = unbuilt_input(plan, kind, entries)
    if unbuilt:
        return f"built from {unbuilt[0]}, which is {unbuilt[1]} now"
    built = _moment(record.get("created_at"))
    for upstream in BUILT_FROM.get(kind, ()):
        if upstream not in entries:
            continue
        folder = artifact(upstream).version_folder(plan.key_of(upstream))
        found = read(upstream) or {}
        used = (record.get("deps") or {}).get(upstream)
        if used and found.get("identity") and used != found["identity"]:
            return f"built from {used}, but {folder} is now {found['identity']}"
        rebuilt = _moment(found.get("created_at"))
        if built is None or rebuilt is None or rebuilt <= built:
            continue
        trained = trained_at(plan) if upstream == "train" else rebuilt
        if trained is None or trained > built:
            return f"built at {record['created_at']} from {folder}, which was rebuilt at {found['created_at']}"
    return None


def trained_at(plan: Plan) -> datetime | None:
    """When the training the train artifact's terminal.json names was saved (its checkpoint's trainer state), or
    None when that cannot be read. What is below train takes terminal.json, not train's record: a terminal
    re-emitted from a completed final checkpoint (a rerun of train that trains nothing) has the same bytes, and
    Snakemake, which compares an input's checksum before its mtime, rebuilds nothing below it."""
    text = storage.read_text(plan.uri(artifact("train").path(plan.version)))
    try:
        checkpoint = json.loads(text or "{}").get("checkpoint_path")
    except (ValueError, AttributeError):
        return None
    state = _trainer_state(checkpoint) if isinstance(checkpoint, str) and checkpoint else None
    return _moment((state or {}).get("created_at"))


def checkpoint_problem(plan: Plan) -> str | None:
    """`--verify`: what is wrong with the checkpoint train's terminal.json names (else the latest one, which a
    resume reads), every file read against its manifest; None when it is sound or there is none."""
    text = storage.read_text(plan.uri(artifact("train").path(plan.version)))
    try:
        checkpoint = json.loads(text or "{}").get("checkpoint_path")
    except (ValueError, AttributeError):
        checkpoint = None  # an unreadable terminal.json is judged by the record's seal, not here
    if not isinstance(checkpoint, str) or not checkpoint:
        root = plan.launch.artifacts.checkpoint_root
        step = checkpoints.latest_step(root)
        checkpoint = None if step is None else checkpoints.step_uri(root, step)
    if checkpoint is None:
        return None
    try:
        verify_stored(checkpoint, read_manifest(checkpoint)["files"])
    except ManifestMismatchError as error:  # one line: the status line and the verdict carry it
        return f"checkpoint {checkpoint} does not match its manifest ({'; '.join(error.problems)}): {error.fix}"
    except ManifestError as error:
        return str(error)
    return None


def _trainer_state(checkpoint_uri: str) -> Entry | None:
    """A checkpoint's trainer state, or None when it has none or it is corrupt (the resume that reads it refuses
    it, naming the file; status judges from the other evidence)."""
    try:
        return checkpoints.read_state(checkpoint_uri)
    except CorruptDocumentError:
        return None


def unbuilt_input(plan: Plan, kind: str, entries: Entry) -> tuple[str, str] | None:
    """The first artifact `kind` is built from that is not done: (its version folder, its state), or None."""
    for upstream in BUILT_FROM.get(kind, ()):
        if upstream in entries and entries[upstream]["state"] != "done":
            return artifact(upstream).version_folder(plan.key_of(upstream)), entries[upstream]["state"]
    return None


def gpu_hours_used(plan: Plan, stored: StoredRecords) -> float | None:
    """GPU-hours a finished training used, every attempt counted, from the trainer's own clock (`perf/elapsed_s`
    in its merged metrics, read through the inventory as their verification read them)."""
    text = stored.inventory.read_text(plan.launch.artifacts.metrics_uri)
    return None if text is None else _gpu_hours(parse_lines(text)[0], plan.launch)


def _gpu_hours(records: list[Entry], launch: LaunchDocument) -> float | None:
    allocation = launch.allocation
    used = used_gpu_hours(records, allocation.num_nodes * allocation.gpus_per_node)
    return None if used is None else round(used, 6)


def _moment(text: Any) -> datetime | None:
    try:
        moment = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def lease_state(lease: Entry | None, now: float, opts: Options, record_path: str) -> Entry:
    """An artifact without a record: `missing`, `failed` when the run that leased it is gone, `running` when a
    process of that run builds it, else `leased`."""
    if lease is None:
        return {"state": "missing"}
    holder = {k: lease.get(k) for k in ("run", "user", "host", "pid", "job", "since")}
    found: Entry = {"holder": holder, "holder_text": describe(lease)}
    gone = owner_gone(lease, now, opts)
    if gone:
        return found | {"state": "failed", "verdict": f"failed: the run building it {gone} (owner gone)"}
    pid = job_process(lease, record_path)
    if pid is not None:
        return found | {"state": "running", "job_pid": pid}
    return found | {
        "state": "leased",
        "verdict": "leased: a live run holds it, but no process of that run is seen building it (it waits for its "
        "inputs, or runs where status cannot see it)",
    }


def owner_gone(lease: Entry, now: float, opts: Options) -> str | None:
    """How the run holding a lease is known to be gone, or None: its process is gone from this host, its
    heartbeat stopped, or the scheduler job it ran in (the lease's `job`) ended."""
    if holder_is_gone(lease):
        return f"is gone: pid {lease.get('pid')} no longer runs on {lease.get('host')}"
    age = float(lease.get("age_s", 0.0))  # by storage's clock (rlbuild/ops/lease.py), not the holder's
    if age > STALE_S:
        return f"stopped heartbeating {age / 60:.0f} min ago"
    scheduler, job = str(lease.get("scheduler") or ""), str(lease.get("job") or "")
    if not scheduler or not job:  # a local run, or a lease that does not say which scheduler's job it ran in
        return None
    state = scheduler_state(scheduler, job, opts)
    if Phase(state["job_phase"]).ended:
        return f"ran in {scheduler} job {job}, which is {state['job_state']}"
    return None


def job_process(lease: Entry, record_path: str) -> int | None:
    """The pid of the lease holder's job that builds the artifact, where the holder runs on this host: a process
    under it whose command line writes the artifact's record (`--record <record>` in every rule's shell)."""
    if lease.get("host") != socket.gethostname():
        return None
    try:
        holder = psutil.Process(int(lease["pid"]))
        if abs(holder.create_time() - float(lease.get("started") or 0)) > 1.0:
            return None  # a reused pid
        children = holder.children(recursive=True)
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None
    writes = re.compile(rf"--record\s+['\"]?\S*{re.escape(record_path)}")
    for child in children:
        try:
            command = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if writes.search(command):
            return child.pid
    return None


def train_ladder(
    launch: LaunchDocument, entry: Entry, opts: Options, now: float, starve_after_s: float = EPISODE_STALL_AFTER_S
) -> Entry:
    """The ladder of a train that is not done, and its state and verdict from it (`starve_after_s`: seconds the
    episodes in play may finish none before the train is stalled)."""
    a = launch.artifacts
    max_steps = launch.recipe.trainer.max_steps
    progress = read_progress(a.attempts_root)
    records, _ = read_run_metrics(a.metrics_uri, a.metrics_segments_root)
    starts = attempt_starts(a.metrics_segments_root)
    checkpoint = checkpoints.latest_step(a.checkpoint_root)
    last_step, last_time = newest_step(records, progress, a.checkpoint_root, checkpoint)
    ladder: Entry = {
        "max_steps": max_steps,
        "last_step": last_step,
        # The trainer's clock, read on this machine's: a clock behind the node's must not make an age negative.
        "last_step_age_s": round(max(now - last_time, 0.0), 1) if last_time is not None else None,
        "trainer_starts": len(starts),
        "resumed_from": starts[-1] if starts and starts[-1] >= 0 else None,
        "last_checkpoint": checkpoint,
        "gpu_hours": _gpu_hours(records, launch),  # so far, every attempt counted
        **pace(records, max_steps, last_step if last_step is not None else -1, progress, starts),
        "gang": gang_state(launch.ray.rendezvous_dir, launch.allocation.num_nodes, opts, now),
    }
    attempt = last_attempt(a.attempts_root)
    ladder["attempt"] = attempt
    ladder["stall_after_s"] = stall_threshold(opts, ladder.get("step_time_s"))
    if progress is not None and isinstance(progress.get("episodes"), dict):
        episodes, last = progress["episodes"], progress["episodes"].get("last_finished")
        ladder["episodes"] = episodes | {"last_finished_age_s": round(max(now - last, 0.0), 1) if last else None}
        ladder["starving"] = starvation(episodes, now, starve_after_s)
    alive = trainer_alive(progress, ladder, entry, now)
    if alive:
        ladder["alive"] = alive
    if entry["state"] == "failed":  # its owner is gone: whatever still runs builds nothing
        return {"state": "failed", "ladder": ladder, "verdict": verdict("failed", ladder, entry, opts)}
    if job_ended(ladder["gang"]) and entry["state"] != "missing":
        state = "failed"
    elif alive and not _exited(attempt):
        state = "running"
    elif attempt is not None and attempt.get("exit_code") == INTERRUPTED_EXIT_CODE:
        state = "interrupted"
        ladder["eta_s"] = ladder["steps_per_min"] = None  # nothing runs: no rate, no end
    elif attempt is not None and attempt.get("exit_code") not in (None, 0):
        state = "failed"
    else:
        state = "leased" if entry["state"] in ("leased", "running") else entry["state"]
    said = verdict(state, ladder, entry, opts)
    if said.startswith("stalled"):  # a rate from before the stall promises nothing
        ladder["eta_s"] = None
    return {"state": state, "ladder": ladder, "verdict": said}


def starvation(episodes: Entry, now: float, bound_s: float) -> str | None:
    """Why an agent run's episodes starve, or None: the batches in play finished no episode for longer than
    `bound_s` (since the last that finished, or since they began), or SANDBOX_ERROR_RATE of the episodes that
    ended since they began failed (at least MIN_ENDED_FOR_RATE of them ended). `episodes` is what the trainer
    publishes in progress.json (rlbuild/contracts/progress.py)."""
    errors = {str(kind): int(n) for kind, n in (episodes.get("errors") or {}).items() if n}
    failed = sum(errors.values())
    ended = failed + int(episodes.get("finished") or 0)
    said = errors_text(errors)
    if episodes.get("playing"):
        quiet = now - max(float(episodes.get("last_finished") or 0.0), float(episodes.get("since") or 0.0))
        if quiet > bound_s:
            return f"stalled: no episodes finished in {_span(quiet)}" + (f" ({said})" if said else "")
    if ended >= MIN_ENDED_FOR_RATE and failed >= SANDBOX_ERROR_RATE * ended:
        return f"stalled: {failed} of {ended} episodes failed ({said})"
    return None


def errors_text(errors: dict[str, int]) -> str:
    """`sandbox errors 37: start error` (one kind), `sandbox errors 37: start error 30, command timeout 7`."""
    if not errors:
        return ""
    kinds = [(kind.replace("_", " "), n) for kind, n in sorted(errors.items(), key=lambda item: -item[1])]
    named = kinds[0][0] if len(kinds) == 1 else ", ".join(f"{kind} {n}" for kind, n in kinds)
    return f"sandbox errors {sum(errors.values())}: {named}"


def _span(seconds: float) -> str:
    return f"{seconds / 60:.0f}m" if seconds >= 60 else f"{seconds:.0f}s"


def newest_step(
    records: list[Entry], progress: Entry | None, checkpoint_root: str, checkpoint: int | None
) -> tuple[int | None, float | None]:
    """The last step and when it was published, from the newest of the metric stream, `progress.json` and the
    latest checkpoint's trainer state (written before the step's progress: a checkpoint never runs ahead)."""
    step = max([int(r["step"]) for r in records] + [int(progress["step"]) if progress else -1])
    when = float(progress["time"]) if progress else None
    if checkpoint is not None and checkpoint > step:
        state = _trainer_state(checkpoints.step_uri(checkpoint_root, checkpoint)) or {}
        step = int(state.get("global_step", checkpoint))
        saved = _moment(state.get("created_at"))
        when = saved.timestamp() if saved is not None else when
    return (step, when) if step >= 0 else (None, None)


def trainer_alive(progress: Entry | None, ladder: Entry, entry: Entry, now: float) -> str | None:
    """What confirms the trainer (or its job) runs, or None: its process on this host, its scheduler job running,
    gang ranks alive, the run's job process, or a trainer on another host that stepped within the stall threshold."""
    gang = ladder.get("gang") or {}
    here = progress is not None and progress.get("host") == socket.gethostname()
    if here and progress is not None and progress.get("phase") != "finished" and _process_since(progress):
        return f"trainer pid {progress['pid']} runs on this host"
    if gang and gang.get("job_phase") == Phase.RUNNING.value:
        return f"{gang.get('scheduler')} job {gang.get('job')} is {gang.get('job_state')}"
    if gang and gang.get("nodes_alive") and not job_ended(gang):
        return f"gang ranks {gang['nodes_alive']} heartbeat"
    if entry.get("job_pid") is not None:
        return f"its job runs as pid {entry['job_pid']} on this host"
    if progress is not None and not here and now - float(progress["time"]) <= ladder["stall_after_s"]:
        return f"the trainer on {progress.get('host')} stepped within {ladder['stall_after_s']:.0f} s"
    return None


def _process_since(progress: Entry) -> bool:
    """The trainer's pid runs a process that started no later than its attempt (not a later one reusing the pid)."""
    try:
        started = float(progress.get("attempt_started") or progress["time"])
        return psutil.Process(int(progress["pid"])).create_time() <= started + 1.0
    except (psutil.Error, KeyError, TypeError, ValueError):
        return False


def stall_threshold(opts: Options, step_time_s: float | None) -> float:
    """Seconds without a step that count as stalled: the one asked for, else STALL_STEPS measured steps (at least
    STALL_FLOOR_S), else STALL_AFTER_S."""
    if opts.stall_after_s is not None:
        return opts.stall_after_s
    return max(STALL_STEPS * step_time_s, STALL_FLOOR_S) if step_time_s else STALL_AFTER_S


def _exited(attempt: Entry | None) -> bool:
    return attempt is not None and attempt.get("exit_code") is not None


def pace(
    records: list[Entry],
    max_steps: int,
    last_step: int,
    progress: Entry | None = None,
    starts: list[int] | None = None,
) -> Entry:
    """Steps/min and ETA from one rate: the trainer's own (the steps of its attempt over the attempt's wall time,
    as its progress line computes its ETA), else the recent steps' step time; engine throughput from their rollout
    tokens/s. `step_time_s` (compute only) sets the stall threshold."""
    recent = [r for r in records if r.get("step", 0) > 0][-RECENT_STEPS:]
    times = [float(r["perf/step_time_s"]) for r in recent if isinstance(r.get("perf/step_time_s"), int | float)]
    rates = [float(r["perf/rollout_tokens_per_s"]) for r in recent if r.get("perf/rollout_tokens_per_s") is not None]
    step_time = sum(times) / len(times) if times else None
    per_step = trainer_rate(progress, starts or []) or step_time
    return {
        "step_time_s": round(step_time, 3) if step_time else None,
        "steps_per_min": round(60 / per_step, 2) if per_step else None,
        "eta_s": round(per_step * max(max_steps - last_step, 0)) if per_step else None,
        "rollout_tokens_per_s": round(sum(rates) / len(rates), 1) if rates else None,
    }


def trainer_rate(progress: Entry | None, starts: list[int]) -> float | None:
    """Seconds per step of the trainer's current attempt, from its own progress document: the attempt's wall time
    (`time - attempt_started`) over the steps it made since it started at its `kept_until` (the metric stream's
    last attempt start). None before its first step."""
    if progress is None or not isinstance(progress.get("attempt_started"), int | float):
        return None
    done = int(progress["step"]) - max(starts[-1] if starts else 0, 0)
    elapsed = float(progress["time"]) - float(progress["attempt_started"])
    return elapsed / done if done > 0 and elapsed > 0 else None


def gang_state(rendezvous_dir: str, nodes: int, opts: Options, now: float) -> Entry | None:
    """The newest gang attempt under the rendezvous folder: job, attempt, ranks alive and with inputs."""
    newest: tuple[float, Rendezvous, Entry] | None = None
    for job in storage.list_names(rendezvous_dir):
        for gang in storage.list_names(storage.join(rendezvous_dir, job)):
            for name in storage.list_names(storage.join(rendezvous_dir, job, gang)):
                if not name.startswith("attempt-") or not name[8:].isdigit():
                    continue
                rdv = Rendezvous(rendezvous_dir, job, gang, int(name[8:]))
                head = rdv.head()
                if head is not None and (newest is None or float(head.get("time", 0)) > newest[0]):
                    newest = (float(head.get("time", 0)), rdv, head | {"attempt": int(name[8:])})
    if newest is None:
        return None
    _, rdv, head = newest
    beats = rdv.heartbeats()
    alive = sorted(r for r, t in beats.items() if now - t <= 3 * HEARTBEAT_S)
    found: Entry = {
        "job": head.get("job"),
        "scheduler": head.get("scheduler"),
        "attempt": head["attempt"],
        "nodes_expected": int(head.get("nodes", nodes)),
        "nodes_alive": alive,
        "ranks_with_inputs": sorted(rdv.ranks_with_inputs()),
        "outcome": None if (o := rdv.outcome()) is None else ("done" if o[0] else f"failed: {o[1]}"),
    }
    return found | scheduler_state(found["scheduler"], found["job"], opts)


def scheduler_state(scheduler: str | None, job: str | None, opts: Options) -> Entry:
    """The authoritative state of a job from its scheduler, or why it could not be asked."""
    if not job or not scheduler:
        return {"job_state": None, "job_phase": Phase.UNKNOWN.value, "job_state_note": "no scheduler job (a local run)"}
    try:
        state = scheduler_for(scheduler, opts.addresses.get(scheduler), where="head.json").job_states([job])[job]
    except (SchedulerUnavailableError, UnknownSchedulerError) as error:
        return {"job_state": None, "job_phase": Phase.UNKNOWN.value, "job_state_note": str(error)}
    return {"job_state": state.word, "job_phase": state.phase.value, "job_state_note": state.note}


def job_ended(gang: Entry | None) -> bool:
    """The gang's scheduler job has ended (succeeded or failed), as its scheduler says."""
    return bool(gang) and Phase(gang.get("job_phase", Phase.UNKNOWN.value)).ended


def last_attempt(attempts_root: str) -> Entry | None:
    """The newest training attempt's id, exit code (None while it runs) and its log's redacted tail."""
    logs = storage.join(attempts_root, "logs")
    names = sorted(storage.list_names(logs))
    if not names:
        return None
    text = streams.read_stream(log_uri(attempts_root, names[-1])) or ""
    lines = text.splitlines()
    codes = [int(m[1]) for line in lines[-3:] if (m := EXITED.search(line))]
    return {
        "id": names[-1],
        "attempts": len(names),
        "exit_code": codes[-1] if codes else None,
        "tail": [redact_text(line) for line in lines[-TAIL_LINES:]],
    }


def verdict(state: str, ladder: Entry, entry: Entry, opts: Options) -> str:
    if state == "failed":
        if entry.get("verdict"):
            still = f"; yet {ladder['alive']}, for no run that will record it" if ladder.get("alive") else ""
            return str(entry["verdict"]) + still
        attempt, gang = ladder.get("attempt") or {}, ladder.get("gang") or {}
        if job_ended(gang):
            return f"failed: {gang.get('scheduler')} job {gang.get('job')} is {gang['job_state']}"
        last = next((line for line in reversed(attempt.get("tail", [])) if "exited with code" not in line), "")
        if cause := storage_refusal(attempt.get("tail", [])):
            return f"failed: {cause} (attempt {attempt.get('id')} exited with code {attempt.get('exit_code')})"
        return f"failed: attempt {attempt.get('id')} exited with code {attempt.get('exit_code')}: {last.strip()}"
    if state == "interrupted":
        step = ladder.get("last_checkpoint")
        if step is None:
            return (
                f"interrupted at step {ladder.get('last_step') or 0} before its first checkpoint; a rerun starts at 0"
            )
        return f"interrupted at step {step}, resumable: a rerun resumes from its checkpoint of step {step}"
    if state == "leased":
        seen = "" if ladder.get("last_step") is None else f" (its last step {ladder['last_step']} is older)"
        return (
            f"leased: a live run holds it, but no trainer, gang or job process confirms its training runs{seen} "
            "(it waits for its inputs, or runs where status cannot see it)"
        )
    if state != "running":
        return state
    age = ladder.get("last_step_age_s")
    if age is not None and age > ladder.get("stall_after_s", STALL_AFTER_S):
        return f"stalled: no step for {age / 60:.1f} min (last step {ladder.get('last_step')})"
    if ladder.get("starving"):
        return str(ladder["starving"])
    gang = ladder.get("gang") or {}
    if gang and len(gang["nodes_alive"]) < gang["nodes_expected"]:
        return f"degraded: Ray nodes alive {len(gang['nodes_alive'])}/{gang['nodes_expected']}"
    return "healthy" if ladder.get("last_step") is not None else "starting: no step yet"


def storage_refusal(tail: list[str]) -> str | None:
    """The cause of a failed attempt when the disk or its permissions refused a write (the OSError the trainer or
    `rlbuild train` printed): `no space left on device writing <path>`, else None."""
    for line in reversed(tail):
        if (found := OS_ERROR.search(line)) and int(found[1]) in WRITE_REFUSALS:
            return WRITE_REFUSALS[int(found[1])].format(path=found[2])
    return None


def addresses_from_environment() -> dict[str, str]:
    """Each scheduler's address as its executor plugin reads it from the environment, where set."""
    found = {}
    for name, cls in SCHEDULERS.items():
        option = cls.address_option
        if option is not None and os.environ.get(option.variable):
            found[name] = os.environ[option.variable]
    return found


def following(experiment_root: str, opts: Options) -> list[Entry]:
    """The detached coordinators of this experiment root with their job state, for every scheduler that runs
    them."""
    return [
        entry
        for name, cls in SCHEDULERS.items()
        if cls.runs_coordinators
        for entry in cls(opts.addresses.get(name)).coordinators(experiment_root)
    ]


def title(scheduler: object) -> str:
    """A scheduler's name as a sentence names it (the recorded name where rlbuild knows no such scheduler)."""
    cls = SCHEDULERS.get(str(scheduler))
    return cls.title if cls is not None else str(scheduler)


def target_selection(targets: list[str]) -> tuple[list[str], list[str] | None]:
    """(versions, kinds) a list of targets (`export/v2026.09.21`) asks about: each target's kind and what it is
    built from, in the versions named."""
    versions: list[str] = []
    last = -1
    for target in targets:
        kind, key = kind_of_target(target), key_of_target(target)
        if kind is None or key is None:
            raise StatusTargetError(
                f"{target!r} is not an artifact target; give one such as "
                f"{artifact('export').version_folder('2026.09.21')}"
            )
        if key not in versions:
            versions.append(key)
        last = max(last, KINDS.index(kind))
    return versions, list(KINDS[: last + 1])


class StatusTargetError(RlbuildError):
    """A target `rlbuild status` cannot map to an artifact."""
