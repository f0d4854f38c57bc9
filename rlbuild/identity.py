"""Artifact identity: fingerprints over identity-bearing fields, records beside artifacts, and drift checks.

Placement (cluster, priority, host sizes, retries, executor) never enters a fingerprint. A fixed version
whose stored record disagrees with what the config now resolves to is refused; `dev` rebuilds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from rlbuild.errors import IdentityDriftError

REPO_ROOT = Path(__file__).resolve().parent.parent
RUNTIME_SOURCES = ("rlbuild", "trainer", "plugins/snakemake-executor-plugin-iris/src")
RUNTIME_FILES = ("uv.lock",)
RECORD_NAME = "identity.json"
MUTABLE_VERSION = "dev"


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_reject)


def _reject(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} {value!r} cannot be fingerprinted; use plain data")


def fingerprint(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(fields).encode()).hexdigest()[:16]


@cache
def runtime_source_digest(root: Path = REPO_ROOT) -> str:
    """sha256 over the trainer and library sources plus the lock file: what a checkpoint was written by."""
    digest = hashlib.sha256()
    files: list[Path] = []
    for folder in RUNTIME_SOURCES:
        files += [p for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts]
    files += [root / name for name in RUNTIME_FILES if (root / name).exists()]
    for path in sorted(files):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def make_record(
    *,
    experiment: str,
    kind: str,
    version: str,
    fields: Mapping[str, Any],
    deps: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    fp = fingerprint(fields)
    return {
        "name": experiment,
        "kind": kind,
        "version": version,
        "fingerprint": fp,
        "identity": f"{experiment}/{kind}@{version}:{fp}",
        "deps": dict(deps or {}),
        "runtime_source_digest": runtime_source_digest(),
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "fields": dict(fields),
    }


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
