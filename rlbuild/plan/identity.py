"""Artifact identity: fingerprints over identity-bearing fields, records beside artifacts, and drift checks.

Placement (cluster, priority, host sizes, retries, executor) never enters a fingerprint. A fixed version
whose stored record disagrees with what the config now resolves to is refused; `dev` rebuilds.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from rlbuild.contracts import runtime
from rlbuild.contracts.artifacts import canonical_json, is_mutable
from rlbuild.contracts.recipe import Recipe
from rlbuild.core.errors import IdentityDriftError, RuntimeDriftError

DERIVED_KINDS = ("train", "export", "eval")  # built from the launch document: their fields are the launch's
# Names under which records carry the runtime (launch: runtime.source_digest and runtime.image; base_model): which
# code and image built an artifact is provenance, not configuration.
RUNTIME_FIELDS = frozenset({"source_digest", "runtime_source_digest", "image"})
IMAGE_PROVIDES = "runtime.image_provides"  # what the image declares it holds: provenance beside the image


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


@functools.cache
def recipe_defaults() -> dict[str, Any]:
    """Every recipe key with its default, as a launch record's fields name them (`recipe.trainer.entrypoint`)."""
    return flatten({"recipe": Recipe().model_dump(mode="json")})


def config_diff(
    stored: Mapping[str, Any], current: Mapping[str, Any], runtime_only: frozenset[str] = frozenset()
) -> dict[str, tuple[Any, Any]]:
    """The fields that differ, leaving out which code built the artifact (the runtime source digest, and the
    identities of dependencies in `runtime_only`, which differ for that reason alone): provenance, not
    configuration. A recipe key the stored record lacks is no drift either where it holds its default: the schema
    gained it after the record was written, and the default names what that code did (`max_turns: 1`, the `grpo`
    loop)."""
    ignored = {f"deps.{kind}" for kind in runtime_only}
    known, defaults = flatten(stored).keys(), recipe_defaults()
    return {
        k: v
        for k, v in field_diff(stored, current).items()
        if k.rsplit(".", 1)[-1] not in RUNTIME_FIELDS
        and not k.startswith(IMAGE_PROVIDES)
        and k not in ignored
        and not (k not in known and k in defaults and defaults[k] == v[1])
    }


def check_drift(
    version: str,
    expected: Mapping[str, Mapping[str, Any]],
    read_record: Callable[[str], Mapping[str, Any] | None],
) -> list[str]:
    """Compare each stored record with the record the config resolves to now; return the kinds that differ.

    A completed artifact is never rebuilt, so only its configuration can drift: for a fixed version a changed
    configuration raises IdentityDriftError with a field diff, and a changed runtime source digest alone does not
    (code edits leave completed versions usable), also where it reaches an artifact only through the identity of
    a dependency. For `dev` every difference means a rebuild. `expected` is in build order.
    """
    stale, drifts = record_drift(expected, read_record)
    if drifts and not is_mutable(version):
        raise IdentityDriftError(version, drifts)
    return sorted(stale)


def record_drift(
    expected: Mapping[str, Mapping[str, Any]], read_record: Callable[[str], Mapping[str, Any] | None]
) -> tuple[list[str], dict[str, dict[str, tuple[Any, Any]]]]:
    """(kinds whose stored record has another fingerprint, the configuration diff of those that differ in more
    than the code that built them), `expected` in build order. `check_drift` and `rlbuild status` judge by it."""
    drifts: dict[str, dict[str, tuple[Any, Any]]] = {}
    stale: list[str] = []
    runtime_only: set[str] = set()
    for kind, record in expected.items():
        stored = read_record(kind)
        if stored is None or stored.get("fingerprint") == record["fingerprint"]:
            continue
        stale.append(kind)
        diff = config_diff(stored.get("fields", {}), record["fields"], frozenset(runtime_only))
        if diff:
            drifts[kind] = diff
        else:
            runtime_only.add(kind)
    return stale, drifts


def check_training_runtime(
    version: str,
    digest: str,
    launch_record: Mapping[str, Any] | None,
    checkpoint_state: Mapping[str, Any] | None,
    image: str | None = None,
) -> None:
    """Training that will start or resume runs this code (and `image`): its launch document and checkpoints must
    name it too.

    Only called for a training that is not complete. Raises RuntimeDriftError naming both runtimes and the way out.
    """
    if is_mutable(version):
        return  # a dev launch and its checkpoints follow the fingerprint, which carries the digest
    resolved_runtime = (launch_record or {}).get("fields", {}).get("runtime", {})
    if launch_record is not None and resolved_runtime.get("image") != image:
        raise RuntimeDriftError(
            f"launch/v{version} was resolved for the node image {resolved_runtime.get('image') or '(none: uv.lock)'}, "
            f"but runtime.image now is {image or '(none: uv.lock)'}: training would run in another environment "
            f"than its launch document names. Put runtime.image back, re-resolve the launch with --forcerun "
            "resolve_launch, or build a new version."
        )
    resolved = resolved_runtime.get("source_digest")
    if resolved and resolved != digest:
        raise RuntimeDriftError(
            f"launch/v{version} was resolved by runtime {resolved[:16]}, but the code now is {digest[:16]}: training "
            f"would run other code than its launch document names. Nothing has been trained under version {version} "
            "with the new code; re-resolve the launch for it with --forcerun resolve_launch, or build a new version."
        )
    written = (checkpoint_state or {}).get("runtime_source_digest")
    if written and written != digest:
        raise RuntimeDriftError(
            f"version {version} has checkpoints written by runtime {written[:16]}, but the code now is {digest[:16]}: "
            "resuming would load state written by other code. Build a new version (e.g. "
            f"{version}.1), or start this one over with --config allow_retrain=true."
        )
