"""Identity records as documents: sealed, and naming the digest of every control document their artifact holds.

A record steers what the graph rebuilds and what a job is built from, and the documents it describes (the
launch document, terminal.json, the merged metrics, the manifests of directory artifacts, the eval's results)
steer the stages after it. Manifests cover payloads; this covers the documents that steer them: a job writes
`payload` (`{name in the version folder: sha256}`) and then `record_sha256`, the sha256 of the canonical JSON of
everything else in the record. Whoever reads a record verifies its seal, and the next stage verifies each
document it reads against the record's digest: one edited byte anywhere is a `CorruptDocumentError` naming the
file, never a run that quietly does something else than its records say.

Records written before records were sealed carry neither key and are read as they are: their completed versions
stay usable.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError

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


def document_problem(record: Mapping[str, Any], name: str, data: bytes) -> str | None:
    """Why `data` is not the document `name` the record describes; None when it is (or the record names no
    digest for it: a record written before records were sealed)."""
    expected = (record.get(PAYLOAD) or {}).get(name)
    if expected is None or expected == (found := sha256_bytes(data)):
        return None
    return f"its sha256 is {found[:16]}..., but its record says {expected[:16]}..."


def verify_document(record: Mapping[str, Any], name: str, uri: str) -> bytes:
    """The bytes of the document `name` at `uri`, verified against `record`."""
    data = storage.read_bytes(uri)
    if data is None:
        raise CorruptDocumentError(uri, "it is missing, but its record describes it", RESTORE_DOCUMENT)
    problem = document_problem(record, name, data)
    if problem is not None:
        raise CorruptDocumentError(uri, problem, RESTORE_DOCUMENT)
    return data
