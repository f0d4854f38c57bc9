"""Sealed records and the control documents they describe (rlbuild/contracts/artifacts.py), on real storage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlbuild.contracts.artifacts import (
    CorruptDocumentError,
    parse_record,
    read_record,
    sealed,
    sha256_bytes,
    stored_digests,
    verify_document,
)
from rlbuild.core import storage
from rlbuild.plan.identity import make_record


def _record() -> dict:
    return make_record(experiment="exp", kind="launch", version="2026.09.21", fields={"recipe": {"lr": 1e-6}})


def test_a_sealed_record_reads_back_and_every_single_byte_edit_of_it_is_refused(tmp_path: Path) -> None:
    uri = str(tmp_path / "launch" / "v2026.09.21.identity.json")
    storage.write_json(uri, sealed(_record(), {"launch.yaml": sha256_bytes(b"doc")}))
    assert read_record(uri)["payload"] == {"launch.yaml": sha256_bytes(b"doc")}
    text = Path(uri).read_text()
    refused = 0
    for at, char in enumerate(text):
        if not char.isalnum():
            continue  # an edit of a delimiter may stop it being JSON: refused too, but for another reason
        edited = text[:at] + ("x" if char != "x" else "y") + text[at + 1 :]
        try:
            parse_record(edited, uri)
        except CorruptDocumentError as error:
            assert uri in str(error)
            refused += 1
    assert refused == sum(c.isalnum() for c in text)


def test_a_record_written_before_records_were_sealed_reads_as_it_is() -> None:
    legacy = _record()
    assert parse_record(json.dumps(legacy), "r.json") == legacy
    assert verify_document(legacy, "launch.yaml", __file__)  # it names no digest: nothing to compare


def test_a_document_is_verified_against_its_record_naming_the_file(tmp_path: Path) -> None:
    document = tmp_path / "launch.yaml"
    document.write_text("max_steps: 40\n")
    record = sealed(_record(), stored_digests({"launch.yaml": str(document)}))
    assert verify_document(record, "launch.yaml", str(document)) == b"max_steps: 40\n"
    document.write_text("max_steps: 50\n")
    with pytest.raises(CorruptDocumentError, match=r"launch\.yaml is corrupt: its sha256 is .* its record says"):
        verify_document(record, "launch.yaml", str(document))
    document.unlink()
    with pytest.raises(CorruptDocumentError, match=r"missing, but its record describes it"):
        verify_document(record, "launch.yaml", str(document))
    with pytest.raises(CorruptDocumentError, match="not JSON"):
        parse_record("{", "r.json")
