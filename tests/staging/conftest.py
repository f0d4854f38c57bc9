"""Fixtures for staging tests: an offline Hugging Face cache, model folders, a moto S3 server."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

REPO = "acme/tiny-model"
SHA_A = "a" * 40
SHA_B = "b" * 40


def write_model_folder(folder: Path, weights: bytes, vocab: str = "abc") -> Path:
    """A minimal HF-style model folder (config, weights, tokenizer files)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 8}))
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "tokenizer.json").write_text(json.dumps({"vocab": vocab}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 64}))
    return folder


def add_hf_snapshot(cache: Path, repo: str, sha: str, files: dict[str, bytes], ref: str | None = None) -> None:
    """Add one commit of a model repo to an HF cache, in the real layout (blobs, refs, snapshot links)."""
    storage = cache / f"models--{repo.replace('/', '--')}"
    (storage / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = storage / "snapshots" / sha
    for name, data in files.items():
        blob = storage / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref is not None:
        (storage / "refs").mkdir(exist_ok=True)
        (storage / "refs" / ref).write_text(sha)


def model_files(weights: bytes) -> dict[str, bytes]:
    return {
        "config.json": json.dumps({"model_type": "qwen2"}).encode(),
        "model.safetensors": weights,
        "tokenizer.json": b'{"vocab": "abc"}',
        "model.onnx": b"an alternative format that is not staged",
        "pytorch_model.bin": b"the same weights as a pickle, not staged beside safetensors",
    }


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An offline HF cache holding REPO at two commits (main moved from SHA_A to SHA_B)."""
    cache = tmp_path / "hf-cache"
    add_hf_snapshot(cache, REPO, SHA_A, model_files(b"weights at A"))
    add_hf_snapshot(cache, REPO, SHA_B, model_files(b"weights at B"), ref="main")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def s3_env(s3_root: str) -> str:
    """A moto S3 bucket reached through the SNAKEMAKE_STORAGE_S3_* variables (see tests/conftest.py)."""
    return s3_root
