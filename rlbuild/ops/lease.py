"""One writer per artifact, across machines: a lease in storage, taken before an artifact is built.

A run takes `<experiment root>/.leases/<kind>/v<version>` for every artifact it is about to build, with an atomic
create-if-absent (S3 `If-None-Match: *`, a hard link locally), refreshes it every HEARTBEAT_S seconds with a
conditional overwrite (S3 `If-Match` on the ETag it holds), and deletes it when the run ends. A second run that
finds a lease refuses, naming who holds it; a lease whose heartbeat is older than STALE_S (its holder died) is
taken over with the same conditional overwrite, and the takeover is logged. A lease whose holder ran on this very
machine (same host and boot) and whose process is gone (killed with SIGKILL) is taken over at once: waiting out
the heartbeat would only delay the rerun a person typed after the kill. The identity record written last by the
build, not the lease, is what says an artifact is complete.

A lease's age is read from storage's clock (`storage.read_aged`: the object's Last-Modified against the server's
Date), never from the heartbeat time its holder wrote: a host whose clock runs ahead or behind can neither keep a
lease it stopped refreshing nor take a live one. Every job building under a lease carries it (storage.LEASE_ENV)
and checks it before each write (`storage.fence`): a run that lost it writes nothing more and exits non-zero
naming the run that holds it. A person frees a lease with `rlbuild lease break` (`break_lease`), which refuses a
live holder unless forced and records the break beside the leases, where `rlbuild status` shows it.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from rlbuild.contracts.artifacts import RECORD_NAME, key_of_target, kind_of_target
from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError
from rlbuild.schedulers.registry import job_here

HEARTBEAT_S = 15.0
STALE_S = 120.0  # 8 missed heartbeats, by storage's clock: the holder is gone
LEASES = ".leases"
LEASE_ROOT_ENV = "RLBUILD_LEASE_ROOT"  # the experiment root whose leases a job's run holds
BROKEN = ".broken"  # under LEASES: the breaks of each artifact's lease, `<kind>/v<version>`, a JSON list


class LeaseHeldError(RlbuildError):
    """Another run is building the artifact right now."""


class NoLeaseError(RlbuildError):
    """`rlbuild lease break` named an artifact whose lease nobody holds."""


def lease_uri(experiment_root: str, kind: str, version: str) -> str:
    return storage.join(experiment_root, LEASES, kind, f"v{version}")


def job_lease(kind: str, record: str, environ: MutableMapping[str, str]) -> None:
    """In a job's process (a rule's subcommand): name the lease it builds under, so that its writes and those of
    every process it starts are fenced (storage.fence). The run's experiment root and run id come from the
    Snakemake run that took the lease (`arm_jobs`); the version, from the rule's `--record` path."""
    root = environ.get(LEASE_ROOT_ENV)
    if root and environ.get(storage.LEASE_RUN_ENV):
        version = Path(record).name.removeprefix("v").removesuffix(f".{RECORD_NAME}")
        environ[storage.LEASE_ENV] = lease_uri(root, kind, version)


def arm_jobs(experiment_root: str, run: str, environ: MutableMapping[str, str]) -> None:
    """In the Snakemake run that holds the leases: what its jobs inherit (RLBUILD_* reach cluster jobs too,
    rlbuild/core/wire.py) to fence their writes."""
    environ[LEASE_ROOT_ENV] = experiment_root
    environ[storage.LEASE_RUN_ENV] = run


def lease_of(experiment_root: str, uri: str) -> str | None:
    """The lease an object of an artifact is written under (its version folder's, or its record's); None for an
    object of no artifact."""
    root = experiment_root.rstrip("/") + "/"
    relative = uri.removeprefix(root)
    kind, key = kind_of_target(relative), key_of_target(relative)
    if not uri.startswith(root) or kind is None or key is None:
        return None
    return lease_uri(experiment_root, kind, key)


def _boot_id() -> str:
    """Distinguishes boots of one host, so a pid recorded before a reboot is never mistaken for a live one."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _started(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return 0.0


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class Holder:
    """Who holds a lease: enough for a person to find the run."""

    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    host: str = field(default_factory=socket.gethostname)
    user: str = field(default_factory=getpass.getuser)
    pid: int = field(default_factory=os.getpid)
    started: float = field(default_factory=lambda: _started(os.getpid()))
    boot: str = field(default_factory=_boot_id)
    # The scheduler job this run is part of (a coordinator's, a train job's), as its scheduler names it: status
    # asks that scheduler whether the job ended.
    scheduler: str = field(default_factory=lambda: (job_here(os.environ) or ("", ""))[0])
    job: str = field(default_factory=lambda: (job_here(os.environ) or ("", ""))[1])
    since: str = field(default_factory=_now)

    def document(self) -> str:
        return json.dumps({**self.__dict__, "heartbeat": _now(), "heartbeat_epoch": time.time()}, sort_keys=True)


def describe(document: dict[str, Any]) -> str:
    """Who holds a lease and how long ago it was refreshed (by storage's clock: `age_s`, which `read_lease` and
    `held_leases` add); an unreadable lease says so instead of naming a run that does not exist."""
    age = document.get("age_s")
    ago = f"{age:.0f} s ago" if isinstance(age, int | float) else "at an unknown time"
    if not document.get("run"):
        return f"an unreadable lease (not a lease document rlbuild wrote), last written {ago}"
    job = f", job {document['job']}" if document.get("job") else ""
    return (
        f"run {document.get('run')} of {document.get('user')}@{document.get('host')} (pid {document.get('pid')}{job}) "
        f"since {document.get('since')}, last heartbeat {ago}"
    )


def holder_is_gone(document: dict[str, Any]) -> bool:
    """True only when the holder ran on this machine in this boot and its process no longer exists (a reused pid
    has another start time). A holder on another machine is judged by its heartbeat alone."""
    if document.get("host") != socket.gethostname() or not document.get("boot") or document["boot"] != _boot_id():
        return False
    pid = document.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    return abs(_started(pid) - float(document.get("started") or 0)) > 1.0


def parse(text: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except ValueError:
        return {}  # unreadable: treated as held, and as stale once it is old
    return document if isinstance(document, dict) else {}


def _aged(found: storage.Aged) -> dict[str, Any]:
    return parse(found.text) | {"age_s": found.age_s}


def read_lease(uri: str) -> dict[str, Any] | None:
    """The lease document with its age by storage's clock (`age_s`); None when nobody holds it."""
    found = storage.read_aged(uri)
    return None if found is None else _aged(found)


def held_leases(experiment_root: str) -> dict[str, dict[str, Any]]:
    """Every lease under an experiment root, by `<kind>/v<version>`: one listing of them all, read concurrently."""
    return leases_and_breaks(experiment_root)[0]


def leases_and_breaks(experiment_root: str) -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """(every lease, as `held_leases`; every artifact's recorded lease breaks, by `<kind>/v<version>`), from one
    listing of the leases folder."""
    root = storage.join(experiment_root, LEASES)
    listed = sorted(uri[len(root) + 1 :] for uri in storage.list_tree(root))
    leases = [key for key in listed if key.count("/") == 1 and not key.startswith(f"{BROKEN}/")]
    breaks = [key for key in listed if key.startswith(f"{BROKEN}/") and key.count("/") == 2]
    found = storage.read_many_aged([storage.join(root, key) for key in leases + breaks])
    held = {key: _aged(read) for key in leases if (read := found[storage.join(root, key)]) is not None}
    broken: dict[str, list[dict[str, Any]]] = {}
    for key in breaks:
        read = found[storage.join(root, key)]
        records = json.loads(read.text) if read is not None else []
        broken[key.removeprefix(f"{BROKEN}/")] = records if isinstance(records, list) else []
    return held, broken


def break_lease(experiment_root: str, kind: str, version: str, *, force: bool, stale_s: float = STALE_S) -> str:
    """Delete the lease of `<kind>/v<version>` for a person: refused (LeaseHeldError) while its holder is alive
    unless `force`; the break is recorded beside the leases (who, when, whose lease). Returns what was broken.
    A holder still running loses the lease: its next write is refused (storage.fence), its heartbeat stops."""
    uri = lease_uri(experiment_root, kind, version)
    lease = read_lease(uri)
    if lease is None:
        raise NoLeaseError(f"no run holds the lease of {kind}/v{version} ({uri}): there is nothing to break")
    live = lease["age_s"] <= stale_s and not holder_is_gone(lease) and bool(lease.get("run"))
    if live and not force:
        raise LeaseHeldError(
            f"{kind}/v{version} is held by a live run: {describe(lease)}. Stop that run, or wait {stale_s:.0f} s "
            "after its last heartbeat; `--force` breaks it anyway (that run then stops at its next write)."
        )
    storage.remove(uri)
    record = {
        "by": f"{getpass.getuser()}@{socket.gethostname()}",
        "at": _now(),
        "forced": live,
        "lease": {k: v for k, v in lease.items() if k != "age_s"},
        "holder": describe(lease),
    }
    breaks_uri = storage.join(experiment_root, LEASES, BROKEN, kind, f"v{version}")
    earlier = storage.read_json(breaks_uri) or []
    storage.write_json(breaks_uri, [*earlier, record])
    text = f"broke the lease of {kind}/v{version} ({'a live holder, forced' if live else 'a stale holder'}): "
    return text + record["holder"]


def broken_text(record: dict[str, Any]) -> str:
    """One line for a recorded break, as status shows it."""
    return f"lease broken by {record.get('by')} at {record.get('at')}; it was held by {record.get('holder')}"


class Leases:
    """The leases one run holds, refreshed by one heartbeat thread until `release_all`."""

    def __init__(self, heartbeat_s: float = HEARTBEAT_S, stale_s: float = STALE_S) -> None:
        self.holder = Holder()
        self.heartbeat_s, self.stale_s = heartbeat_s, stale_s
        self.held: dict[str, str] = {}  # uri -> the tag we last wrote
        self.lost: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self, uri: str, what: str) -> None:
        """Take the lease at `uri` for building `what`; LeaseHeldError if a live run holds it."""
        document = self.holder.document()
        if storage.create_exclusive(uri, document):
            self.held[uri] = storage.read_tagged(uri)[1]  # type: ignore[index]
            return
        found = storage.read_aged(uri)
        if found is None:  # released between our two calls
            return self.acquire(uri, what)
        current = _aged(found)
        if current.get("run") == self.holder.run:
            self.held[uri] = found.tag
            return None
        if found.age_s <= self.stale_s and not holder_is_gone(current):
            raise LeaseHeldError(
                f"{what} is being built by {describe(current)}; wait for that run to finish (or stop it), then run "
                f"again. A lease without a heartbeat for {self.stale_s:.0f} s is taken over ({uri})."
            )
        tag = storage.replace_if(uri, document, found.tag)
        if tag is None:  # another run took it over first
            return self.acquire(uri, what)
        print(f"rlbuild: took over the stale lease of {what} from {describe(current)}", file=sys.stderr, flush=True)
        self.held[uri] = tag
        return None

    def clear_abandoned(self, experiment_root: str, complete: Callable[[str, str], bool]) -> list[str]:
        """Delete the leases other runs left on artifacts that are complete now (`complete(kind, version)`) and
        whose holder is gone or stopped heartbeating: a killed run leaves the leases of what it had finished, and
        they would name an owner that no longer exists. Returns the `<kind>/v<version>` cleared."""
        cleared: list[str] = []
        for key, document in held_leases(experiment_root).items():
            kind, _, version = key.partition("/v")
            if document.get("run") == self.holder.run:
                continue
            stale = document["age_s"] > self.stale_s
            if (stale or holder_is_gone(document)) and complete(kind, version):
                storage.remove(lease_uri(experiment_root, kind, version))
                cleared.append(key)
        return cleared

    def start_heartbeat(self) -> None:
        if self._thread is None and self.held:
            self._thread = threading.Thread(target=self._beat, name="rlbuild-lease-heartbeat", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            for uri, tag in list(self.held.items()):
                try:
                    new = storage.replace_if(uri, self.holder.document(), tag)
                except Exception as error:  # a storage hiccup: the next beat tries again
                    print(f"rlbuild: lease heartbeat for {uri} failed: {error}", file=sys.stderr, flush=True)
                    continue
                if new is None:
                    del self.held[uri]
                    self._report_lost(uri)
                    self.lost.append(uri)  # after the report: whoever waits on `lost` finds it said
                else:
                    self.held[uri] = new

    def _report_lost(self, uri: str) -> None:
        """Who holds a lost lease now: its jobs stop at their next write (storage.fence), naming the same run."""
        try:
            holder = read_lease(uri)
        except storage.StorageError as error:
            now = f"(storage did not say who holds it now: {error})"
        else:
            now = f"to {describe(holder)}" if holder else "(it was broken or released: nobody holds it now)"
        lost = f"rlbuild: run {self.holder.run} lost the lease {uri} {now}; its jobs write nothing more"
        print(lost, file=sys.stderr, flush=True)

    def release_all(self) -> None:
        """Stop the heartbeat and delete every lease that is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.heartbeat_s)
        for uri in list(self.held):
            try:
                document = read_lease(uri)
                if document is not None and document.get("run") == self.holder.run:
                    storage.remove(uri)
            except (storage.StorageError, RuntimeError) as error:
                # Storage gone, or (at interpreter exit) the S3 client's executor already shut down: the lease
                # is left to expire; its heartbeat stopped, so it is taken over after STALE_S (at once on this host).
                print(f"rlbuild: left the lease {uri} to expire after {self.stale_s:.0f} s ({error})", file=sys.stderr)
            del self.held[uri]
