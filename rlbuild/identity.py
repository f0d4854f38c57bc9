"""Artifact identity: fingerprints over identity-bearing fields, records beside artifacts, and drift checks.

Placement (cluster, priority, host sizes, retries, executor) never enters a fingerprint. A fixed version
whose stored record disagrees with what the config now resolves to is refused; `dev` rebuilds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from rlbuild import runtime
from rlbuild.artifacts import MUTABLE_VERSION
from rlbuild.errors import IdentityDriftError

DERIVED_KINDS = ("train", "export", "eval")  # built from the launch document: their fields are the launch's


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_reject)


def _reject(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} {value!r} cannot be fingerprinted; use plain data")


def fingerprint(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()[:16]


def make_record(
    *, experiment: str, kind: str, version: str, fields: Mapping[str, Any], deps: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The identity record of one artifact. Preflight and the jobs that write records both call this (through
    `derived_record` for the kinds built from a launch document), so a stored record and the one the config
    resolves to agree field for field."""
    fp = fingerprint(fields)
    return {
        "name": experiment,
        "kind": kind,
        "version": version,
        "fingerprint": fp,
        "identity": f"{experiment}/{kind}@{version}:{fp}",
        "deps": dict(deps or {}),
        "runtime_source_digest": runtime.source_digest(),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "fields": dict(fields),
    }


def derived_record(launch_record: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """The record of an artifact built from a launch document (train, export, eval): the launch's fields."""
    if kind not in DERIVED_KINDS:
        raise ValueError(f"{kind} is not built from a launch document; use one of {DERIVED_KINDS}")
    return make_record(
        experiment=launch_record["name"],
        kind=kind,
        version=launch_record["version"],
        fields=launch_record["fields"],
        deps={"launch": launch_record["identity"]},
    )


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def field_diff(stored: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    a, b = flatten(stored), flatten(current)
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def check_drift(
    version: str,
    expected: Mapping[str, Mapping[str, Any]],
    read_record: Callable[[str], Mapping[str, Any] | None],
) -> list[str]:
    """Compare each artifact's stored record with the record the config resolves to now.

    `expected` maps an artifact kind to its current record. Returns the kinds whose stored record is stale
    (only possible for the mutable `dev` version); raises IdentityDriftError for a fixed version.
    """
    drifts: dict[str, dict[str, tuple[Any, Any]]] = {}
    for kind, record in expected.items():
        stored = read_record(kind)
        if stored is None or stored.get("fingerprint") == record["fingerprint"]:
            continue
        diff = field_diff(stored.get("fields", {}), record["fields"])
        drifts[kind] = diff or {"fingerprint": (stored.get("fingerprint"), record["fingerprint"])}
    if drifts and version != MUTABLE_VERSION:
        raise IdentityDriftError(version, drifts)
    return sorted(drifts)
