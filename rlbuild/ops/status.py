"""`rlbuild status`: what storage (and, for a running job, the scheduler) says about every artifact of a version.

Each artifact is `done` (its record is stored and matches the configuration), `stale` (a record from another
configuration), `running` (a run holds its lease and heartbeats, or its trainer is stepping), `failed` (its last
attempt ended badly, or the run that leased it stopped heartbeating) or `missing`. A train that runs or failed
also gets the monitoring ladder (seed 003): the scheduler's job state and attempt, ranks that materialised their
inputs, Ray nodes alive N/N, engine throughput, where it resumed, the last step and its age, steps/min and ETA,
the last checkpoint, restarts, and the redacted tail of the failure; and a verdict a person can act on.
Everything comes from what the gang and the trainer publish in storage (rlbuild/contracts/progress.py): no node
is asked.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from typing import Any

from rlbuild.contracts import checkpoints
from rlbuild.contracts.artifacts import ARTIFACTS, MUTABLE_VERSION, artifact
from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.metricstream import attempt_starts, read_run_metrics
from rlbuild.contracts.progress import HEARTBEAT_S, read_progress
from rlbuild.core import storage, streams
from rlbuild.core.errors import RlbuildError
from rlbuild.core.inventory import Inventory
from rlbuild.core.redact import redact_text
from rlbuild.job.attempt import log_uri
from rlbuild.job.rendezvous import Rendezvous
from rlbuild.ops.coordinator import following
from rlbuild.ops.lease import STALE_S, describe, held_leases
from rlbuild.plan.identity import record_drift
from rlbuild.plan.resolve import Plan, resolve
from rlbuild.plan.spec import Experiment
from rlbuild.plan.versioning import StoredRecords
from rlbuild.schedulers.base import Phase, SchedulerUnavailableError
from rlbuild.schedulers.registry import UnknownSchedulerError, scheduler_for

# Without a measured step time, a training is stalled after 10 minutes without a step; with one, after
# STALL_STEPS steps' worth (checkpoints and evals take a few steps' time), never under STALL_FLOOR_S.
STALL_AFTER_S = 600.0
STALL_STEPS = 20
STALL_FLOOR_S = 60.0
TAIL_LINES = 20
RECENT_STEPS = 10  # steps averaged for steps/min, ETA and engine throughput
EXITED = re.compile(r"\[rlbuild\] attempt \S+ exited with code (-?\d+)")
Entry = dict[str, Any]


@dataclass(frozen=True)
class Options:
    stall_after_s: float | None = None  # None: from the measured step time (stall_threshold)
    iris_url: str | None = None  # the controller to ask about Iris jobs (None: storage only)


def gather(
    experiment: Experiment, versions: list[str], storage_root: str, kinds: list[str] | None, opts: Options
) -> Entry:
    """The status document: `{"experiment", "storage_root", "versions": {v: {kind: {"state", ...}}}}`."""
    now = time.time()
    storage_root = unscoped(storage_root, experiment.name)
    root = storage.join(storage_root, experiment.name)
    leases = held_leases(root)
    inventory = Inventory(root)  # one listing per folder answers every version's records
    found: Entry = {}
    for version in versions:
        try:
            plan = resolve(experiment, version, storage_root)
        except RlbuildError as error:
            found[version] = {"error": redact_text(str(error))}
            continue
        found[version] = version_status(plan, leases, kinds, opts, now, inventory)
    document = {"experiment": experiment.name, "storage_root": storage_root, "versions": found}
    document["coordinators"] = following(root, opts.iris_url)
    return document | {"verdict": overall(found)}


def unscoped(storage_root: str, experiment: str) -> str:
    """The storage root above the experiment root, read as Snakemake's storage scoping reads a default storage
    prefix (rlbuild/workflow.py:scope_storage): one that already ends in the experiment's name is its root."""
    if "://" in storage_root and storage_root.rstrip("/").endswith(f"/{experiment}"):
        return storage_root.rstrip("/")[: -len(experiment) - 1]
    return storage_root


def overall(versions: Entry) -> str:
    """One line for the whole selection: the train's verdict where one runs or failed, else what is left."""
    unresolved = [version for version, kinds in versions.items() if "error" in kinds]
    if unresolved:
        return f"invalid: version {', '.join(unresolved)} cannot be resolved (the error is above)"
    entries = [e for kinds in versions.values() for e in kinds.values() if isinstance(e, dict)]
    for word in ("failed", "stalled", "degraded", "healthy", "starting"):
        for entry in entries:
            if str(entry.get("verdict", "")).startswith(word):
                return str(entry["verdict"])
    if any(e["state"] == "running" for e in entries):
        return "running"
    left = [e["state"] for e in entries if e["state"] != "done"]
    return "done" if not left and entries else f"{len(left)} of {len(entries)} artifacts not built"


def version_status(
    plan: Plan,
    leases: dict[str, Entry],
    kinds: list[str] | None,
    opts: Options,
    now: float,
    inventory: Inventory | None = None,
) -> Entry:
    stored = StoredRecords(plan, inventory)
    stale, drifts = record_drift(plan.records, stored.read)
    entries: Entry = {}
    for a in ARTIFACTS:
        if a.kind not in plan.records or (kinds is not None and a.kind not in kinds):
            continue
        entry: Entry = {"uri": plan.uri(a.path(plan.version))}
        record = stored.read(a.kind)
        if record is not None:
            changed = a.kind in drifts or (plan.version == MUTABLE_VERSION and a.kind in stale)
            entry |= {"state": "stale" if changed else "done", "built_at": record.get("created_at")}
            if a.kind in drifts:
                entry["changed"] = sorted(drifts[a.kind])
        else:
            entry |= lease_state(leases.get(f"{a.kind}/v{plan.version}"), now)
        if a.kind == "train" and entry["state"] != "done":
            entry |= train_ladder(plan.launch, entry, opts, now)
        entries[a.kind] = entry
    return entries


def lease_state(lease: Entry | None, now: float) -> Entry:
    if lease is None:
        return {"state": "missing"}
    age = now - float(lease.get("heartbeat_epoch", 0))
    holder = {k: lease.get(k) for k in ("run", "user", "host", "pid", "job", "since")}
    if age <= STALE_S:
        return {"state": "running", "holder": holder, "holder_text": describe(lease)}
    return {
        "state": "failed",
        "holder": holder,
        "verdict": f"failed: the run building it stopped heartbeating {age / 60:.0f} min ago ({describe(lease)})",
    }


def train_ladder(launch: LaunchDocument, entry: Entry, opts: Options, now: float) -> Entry:
    """The ladder of a train that is not done, and its state and verdict from it."""
    a = launch.artifacts
    progress = read_progress(a.attempts_root)
    records, _ = read_run_metrics(a.metrics_uri, a.metrics_segments_root)
    starts = attempt_starts(a.metrics_segments_root)
    last_step = max([int(r["step"]) for r in records] + [int(progress["step"]) if progress else -1])
    ladder: Entry = {
        "max_steps": launch.recipe.trainer.max_steps,
        "last_step": last_step if last_step >= 0 else None,
        # The trainer's clock, read on this machine's: a clock behind the node's must not make an age negative.
        "last_step_age_s": round(max(now - float(progress["time"]), 0.0), 1) if progress else None,
        "trainer_starts": len(starts),
        "resumed_from": starts[-1] if starts and starts[-1] >= 0 else None,
        "last_checkpoint": checkpoints.latest_step(a.checkpoint_root),
        **pace(records, launch.recipe.trainer.max_steps, last_step),
        "gang": gang_state(launch.ray.rendezvous_dir, launch.iris.allocation.num_nodes, opts, now),
    }
    attempt = last_attempt(a.attempts_root)
    ladder["attempt"] = attempt
    ladder["stall_after_s"] = stall_threshold(opts, ladder.get("step_time_s"))
    stepping = progress is not None and now - float(progress["time"]) <= ladder["stall_after_s"]
    if entry["state"] == "running" and job_ended(ladder["gang"]):
        state = "failed"
    elif entry["state"] == "running" or (stepping and not _exited(attempt)):
        state = "running"
    elif attempt is not None and attempt.get("exit_code") not in (None, 0):
        state = "failed"
    else:
        state = entry["state"]
    return {"state": state, "ladder": ladder, "verdict": verdict(state, ladder, entry, opts)}


def stall_threshold(opts: Options, step_time_s: float | None) -> float:
    """Seconds without a step that count as stalled: the one asked for, else STALL_STEPS measured steps (at least
    STALL_FLOOR_S), else STALL_AFTER_S."""
    if opts.stall_after_s is not None:
        return opts.stall_after_s
    return max(STALL_STEPS * step_time_s, STALL_FLOOR_S) if step_time_s else STALL_AFTER_S


def _exited(attempt: Entry | None) -> bool:
    return attempt is not None and attempt.get("exit_code") is not None


def pace(records: list[Entry], max_steps: int, last_step: int) -> Entry:
    """Steps/min and ETA from the recent steps' wall time, engine throughput from their rollout tokens/s."""
    recent = [r for r in records if r.get("step", 0) > 0][-RECENT_STEPS:]
    times = [float(r["perf/step_time_s"]) for r in recent if isinstance(r.get("perf/step_time_s"), int | float)]
    rates = [float(r["perf/rollout_tokens_per_s"]) for r in recent if r.get("perf/rollout_tokens_per_s") is not None]
    step_time = sum(times) / len(times) if times else None
    return {
        "step_time_s": round(step_time, 3) if step_time else None,
        "steps_per_min": round(60 / step_time, 2) if step_time else None,
        "eta_s": round(step_time * max(max_steps - last_step, 0)) if step_time else None,
        "rollout_tokens_per_s": round(sum(rates) / len(rates), 1) if rates else None,
    }


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
        "scheduler": head.get("scheduler", "iris"),
        "attempt": head["attempt"],
        "nodes_expected": int(head.get("nodes", nodes)),
        "nodes_alive": alive,
        "ranks_with_inputs": sorted(rdv.ranks_with_inputs()),
        "outcome": None if (o := rdv.outcome()) is None else ("done" if o[0] else f"failed: {o[1]}"),
    }
    return found | scheduler_state(found["scheduler"], found["job"], opts)


def scheduler_state(scheduler: str, job: str | None, opts: Options) -> Entry:
    """The authoritative state of a job from its scheduler, or why it could not be asked."""
    if not job:
        return {"job_state": None, "job_phase": Phase.UNKNOWN.value, "job_state_note": "no scheduler job (a local run)"}
    try:
        state = scheduler_for(scheduler, opts.iris_url, where="head.json").job_states([job])[job]
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
            return str(entry["verdict"])
        attempt, gang = ladder.get("attempt") or {}, ladder.get("gang") or {}
        if job_ended(gang):
            return f"failed: {gang.get('scheduler', 'iris')} job {gang.get('job')} is {gang['job_state']}"
        last = next((line for line in reversed(attempt.get("tail", [])) if "exited with code" not in line), "")
        return f"failed: attempt {attempt.get('id')} exited with code {attempt.get('exit_code')}: {last.strip()}"
    if state != "running":
        return state
    age = ladder.get("last_step_age_s")
    if age is not None and age > ladder.get("stall_after_s", STALL_AFTER_S):
        return f"stalled: no step for {age / 60:.1f} min (last step {ladder.get('last_step')})"
    gang = ladder.get("gang") or {}
    if gang and len(gang["nodes_alive"]) < gang["nodes_expected"]:
        return f"degraded: Ray nodes alive {len(gang['nodes_alive'])}/{gang['nodes_expected']}"
    return "healthy" if ladder.get("last_step") is not None else "starting: no step yet"


def iris_url_from_environment() -> str | None:
    return os.environ.get("SNAKEMAKE_IRIS_CONTROLLER_URL") or None


def target_selection(targets: list[str]) -> tuple[list[str], list[str] | None]:
    """(versions, kinds) a list of targets (`export/v2026.09.21`) asks about: each target's kind and what it is
    built from, in the versions named."""
    from rlbuild.contracts.artifacts import KINDS, kind_of_target

    versions: list[str] = []
    last = -1
    for target in targets:
        kind = kind_of_target(target)
        match = re.search(r"/v([^/]+)", target)
        if kind is None or match is None:
            raise StatusTargetError(
                f"{target!r} is not an artifact target; give one such as "
                f"{artifact('export').version_folder('2026.09.21')}"
            )
        if match[1] not in versions:
            versions.append(match[1])
        last = max(last, KINDS.index(kind))
    return versions, list(KINDS[: last + 1])


class StatusTargetError(RlbuildError):
    """A target `rlbuild status` cannot map to an artifact."""
