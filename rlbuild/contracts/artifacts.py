"""The artifact table: every kind of artifact, the rule that writes it, where it lives and where its record is;
and the records as documents (sealed, naming the digests of the artifact's control documents: below).

Defined once; the rules, the plan printer, the records and `rlbuild status` read it. Paths are relative to the
experiment root `<storage root>/<experiment name>`; Snakemake runs with that root as its working directory
(local storage) or default storage prefix (S3), so they are also the targets users type.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError

RECORD_NAME = "identity.json"
METRICS_NAME = (
    "metrics.jsonl"  # the train artifact's merged metrics, beside terminal.json (rlbuild/contracts/metricstream.py)
)
MUTABLE_VERSION = "dev"
# An arm of a series builds under the version key `<version>@<arm>` (`export/v2026.09.21@kl-low/`); an experiment
# without arms keeps the plain version. '@' is neither a version's nor an arm name's character.
ARM_SEPARATOR = "@"
# The export's model (weights, config, tokenizer, generation config, card) sits in this folder of the export's
# version folder; its manifest and Snakemake's marker sit beside it, so the model folder is exactly the model.
EXPORT_MODEL = "model"
# The export card's license where the experiment names none (`license:`): the Hub's "other", which the card
# explains (the base model's and the data's terms apply).
DEFAULT_LICENSE = "other"


@dataclass(frozen=True)
class Artifact:
    """One kind of artifact, in build order."""

    kind: str  # the identity kind in records: `<experiment>/<kind>@<version>:<fingerprint>`
    rule: str  # the Snakemake rule that writes it
    folder: str  # versions live in `<folder>/v<version>/`
    output: str  # the file the rule declares inside the version folder; "" when the folder itself is the output
    # The control documents of the version folder that steer later stages: the record names their digests
    # (rlbuild/contracts/artifacts.py) and the next stage verifies them.
    documents: tuple[str, ...] = ()

    def version_folder(self, version: str) -> str:
        return f"{self.folder}/v{version}"

    def path(self, version: str = "{version}") -> str:
        """The rule's output: the version folder, or the file in it (`{version}` for the rule's pattern)."""
        folder = self.version_folder(version)
        return f"{folder}/{self.output}" if self.output else folder

    def file(self, version: str, name: str) -> str:
        """Another file the artifact keeps in its version folder (the train artifact's `metrics.jsonl`)."""
        return f"{self.version_folder(version)}/{name}"

    def record(self, version: str = "{version}") -> str:
        """Where the identity record lives: beside the version folder, never inside a directory output, so that
        it is uploaded after the whole artifact (rules declare it last) and its presence means complete."""
        return record_of(self.version_folder(version))

    @property
    def is_directory(self) -> bool:
        return not self.output


ARTIFACTS: tuple[Artifact, ...] = (
    Artifact("base_model", "base_model", "base_model", ""),
    Artifact("stage_model", "stage_model", "stage/model", "", ("manifest.json",)),
    Artifact("stage_data", "stage_data", "stage/data", "", ("manifest.json",)),
    Artifact("launch", "resolve_launch", "launch", "launch.yaml", ("launch.yaml",)),
    Artifact("train", "train", "train", "terminal.json", ("terminal.json", METRICS_NAME)),
    Artifact("export", "export", "export", "", ("manifest.json",)),
    Artifact("eval", "eval", "eval", "results.json", ("results.json",)),
)


def record_of(version_folder: str) -> str:
    """The record beside a version folder (a path or URI)."""
    return f"{version_folder.rstrip('/')}.{RECORD_NAME}"


BY_KIND = {a.kind: a for a in ARTIFACTS}
KINDS = tuple(a.kind for a in ARTIFACTS)


def artifact(kind: str) -> Artifact:
    return BY_KIND[kind]


def experiment_root(storage_root: str, experiment: str) -> str:
    """The experiment root, every path of the table's base: the experiment's name under a storage root (a local
    path or URI). Every reader and writer of an experiment's artifacts finds them by this one join."""
    return storage.join(storage_root, experiment)


def version_of(key: str) -> str:
    """The version of a version key (`2026.09.21@kl-low` -> `2026.09.21`)."""
    return key.split(ARM_SEPARATOR, 1)[0]


def arm_of(key: str) -> str | None:
    """The arm of a version key (`2026.09.21@kl-low` -> `kl-low`; a plain version has none)."""
    return key.split(ARM_SEPARATOR, 1)[1] if ARM_SEPARATOR in key else None


def arm_key(version: str, arm: str | None) -> str:
    return version if arm is None else f"{version}{ARM_SEPARATOR}{arm}"


def is_mutable(key: str) -> bool:
    """`dev` (and every arm of it) is rebuilt when its configuration changes; a calendar version is fixed."""
    return version_of(key) == MUTABLE_VERSION


def kind_of_target(target: str) -> str | None:
    """The artifact kind a target path (`export/v2026.09.21`, `stage/model/vdev/config.json`) belongs to."""
    for a in sorted(ARTIFACTS, key=lambda a: -len(a.folder)):
        if target == a.folder or target.startswith(f"{a.folder}/v"):
            return a.kind
    return None


def terminal_stage(targets: list[str], version: str) -> str:
    """The last artifact kind an invocation asks of `version`, as its plan reports it: the default target (no
    targets, or `all`) builds every kind. One function for the dry run and `rlbuild check`, so both say the same."""
    if not targets or "all" in targets:
        return ARTIFACTS[-1].kind
    asked = {kind_of_target(t) for t in targets if f"/v{version}" in t}
    return next((a.kind for a in reversed(ARTIFACTS) if a.kind in asked), ARTIFACTS[-1].kind)


def key_of_target(target: str) -> str | None:
    """The version key an artifact target names (`export/v2026.09.21`, `train/v2026.09.21@kl-low/terminal.json`,
    `launch/v2026.09.21.identity.json` -> `2026.09.21...`), or None for any other target."""
    if kind_of_target(target) is None:
        return None
    match = re.search(rf"/v([^/]+?)(?:\.{re.escape(RECORD_NAME)})?(?:/|$)", target)
    return match[1] if match else None


@dataclass(frozen=True)
class TemporaryPaths:
    """Checkpoints, attempt state and the metrics stream of one training run: under `tmp/ttl=<N>d/` so a bucket
    lifecycle rule can expire them. A `dev` run's live under its fingerprint, so a changed configuration never
    resumes another's."""

    version: str
    ttl_days: int
    fingerprint: str

    @property
    def root(self) -> str:
        base = f"tmp/ttl={self.ttl_days}d/{artifact('train').version_folder(self.version)}"
        return f"{base}/{self.fingerprint}" if is_mutable(self.version) else base

    @property
    def checkpoints(self) -> str:
        return f"{self.root}/checkpoints"

    @property
    def attempts(self) -> str:
        return f"{self.root}/attempts"

    @property
    def metrics(self) -> str:
        """The metrics stream's segments while the run goes; merged into `train/v<version>/metrics.jsonl` at its end."""
        return f"{self.root}/metrics"

    @property
    def trajectories(self) -> str:
        """A sample of an agent run's training episodes, a JSONL file per step that wrote one (debugging data)."""
        return f"{self.root}/trajectories"


# Identity records as documents: sealed, and naming the digest of every control document their artifact holds.
#
# A record steers what the graph rebuilds and what a job is built from, and the documents it describes (the
# launch document, terminal.json, the merged metrics, the manifests of directory artifacts, the eval's results)
# steer the stages after it. Manifests cover payloads; this covers the documents that steer them: a job writes
# `payload` (`{name in the version folder: sha256}`) and then `record_sha256`, the sha256 of the canonical JSON of
# everything else in the record. Whoever reads a record verifies its seal, and the next stage verifies each
# document it reads against the record's digest: one edited byte anywhere is a `CorruptDocumentError` naming the
# file, never a run that quietly does something else than its records say.
#
# Records written before records were sealed carry neither key and are read as they are: their completed versions
# stay usable.

SEAL = "record_sha256"
PAYLOAD = "payload"
# What a record written before records were sealed holds (rlbuild/plan/identity.py:make_record): one without a
# seal that holds anything else lost its seal to an edit.
UNSEALED_KEYS = frozenset(
    {"name", "kind", "version", "fingerprint", "identity", "deps", "runtime_source_digest", "created_at", "fields"}
)


class CorruptDocumentError(RlbuildError):
    """A control document (a record, or a document a record describes) changed after it was written."""

    def __init__(self, where: str, problem: str, fix: str) -> None:
        self.where, self.problem, self.fix = where, problem, fix
        super().__init__(f"{where} is corrupt: {problem}. {fix}")

    def __reduce__(self) -> tuple[type, tuple[str, str, str]]:
        return (type(self), (self.where, self.problem, self.fix))


RESTORE_RECORD = (
    "Restore the file, or delete it (with its artifact's version folder) so that its rule builds the artifact again"
)
RESTORE_DOCUMENT = (
    "It was edited or damaged after its record was written; restore it, or delete the artifact's record so that its "
    "rule builds it again"
)


def canonical_json(value: Any) -> str:
    """The one serialisation fingerprints and seals are taken over: sorted keys, no spaces, UTF-8 as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_reject)


def _reject(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} {value!r} cannot be fingerprinted; use plain data")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _seal_of(record: Mapping[str, Any]) -> str:
    return sha256_bytes(canonical_json({k: v for k, v in record.items() if k != SEAL}).encode())


def sealed(record: Mapping[str, Any], payload: Mapping[str, str] | None = None) -> dict[str, Any]:
    """`record` with the digests of its artifact's control documents (`payload`: {name: sha256}) and its seal:
    what a job writes, last."""
    found = {k: v for k, v in record.items() if k not in (SEAL, PAYLOAD)}
    if payload:
        found[PAYLOAD] = dict(payload)
    return found | {SEAL: _seal_of(found)}


def stored_digests(documents: Mapping[str, str]) -> dict[str, str]:
    """{name: sha256} of each document ({name: where it is stored now}); every one must exist."""
    found: dict[str, str] = {}
    for name, uri in documents.items():
        data = storage.read_bytes(uri)
        if data is None:
            raise CorruptDocumentError(uri, "it is missing where its job wrote it", "Run the rule again")
        found[name] = sha256_bytes(data)
    return found


def parse_record(text: str, where: str) -> dict[str, Any]:
    """A stored record, its seal verified."""
    try:
        record = json.loads(text)
    except ValueError as error:
        raise CorruptDocumentError(where, f"it is not JSON ({error})", RESTORE_RECORD) from None
    if not isinstance(record, dict):
        raise CorruptDocumentError(where, f"it holds a JSON {type(record).__name__}, not a record", RESTORE_RECORD)
    seal = record.get(SEAL)
    if seal is None and not record.keys() <= UNSEALED_KEYS:
        unknown = sorted(record.keys() - UNSEALED_KEYS)
        raise CorruptDocumentError(where, f"it has no seal {SEAL} but has {unknown}", RESTORE_RECORD)
    if seal is not None and seal != _seal_of(record):
        raise CorruptDocumentError(
            where,
            f"its content no longer matches its seal {SEAL} (edited or damaged since it was written)",
            RESTORE_RECORD,
        )
    return record


def read_record(uri: str) -> dict[str, Any] | None:
    """The record at `uri`, its seal verified; None when there is none."""
    text = storage.read_text(uri)
    return None if text is None else parse_record(text, uri)


def check_document(record: Mapping[str, Any], name: str, uri: str, data: bytes | None) -> bytes | None:
    """`data` (the bytes at `uri`; None: absent), verified as the document `name` the record describes;
    CorruptDocumentError when it is not. A record that names no digest for it (written before records were
    sealed) vouches for nothing, so nothing is compared."""
    expected = (record.get(PAYLOAD) or {}).get(name)
    if expected is None:
        return data
    if data is None:
        raise CorruptDocumentError(uri, "it is missing, but its record describes it", RESTORE_DOCUMENT)
    if (found := sha256_bytes(data)) != expected:
        raise CorruptDocumentError(
            uri, f"its sha256 is {found[:16]}(...), but its record says {expected[:16]}(...)", RESTORE_DOCUMENT
        )
    return data


def verify_document(record: Mapping[str, Any], name: str, uri: str) -> bytes | None:
    """The bytes of the document `name` at `uri` (None: absent, and the record names no digest for it), verified
    against `record`."""
    return check_document(record, name, uri, storage.read_bytes(uri))
