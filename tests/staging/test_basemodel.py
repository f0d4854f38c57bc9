"""The base_model stage's cache: a build is kept whole under the digest of what builds it and copied from there;
a failed build is not kept; another seed or variant is another key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbuild.contracts.tinymodel import AGENT_VARIANT
from rlbuild.contracts.tinymodel import DEFAULT_VARIANT as V
from rlbuild.stages.basemodel import build_or_copy, cache_key


def _builder(calls: list[Path], code: int = 0):
    def build(out: Path) -> int:
        calls.append(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.safetensors").write_bytes(b"weights")
        (out / "tokenizer.json").write_text("{}")
        return code

    return build


def test_a_build_is_kept_and_the_next_one_copies_it(tmp_path: Path) -> None:
    calls: list[Path] = []
    folder = tmp_path / "cache"
    assert build_or_copy(tmp_path / "first", 7, V, _builder(calls), folder) == 0
    assert build_or_copy(tmp_path / "second", 7, V, _builder(calls), folder) == 0
    assert calls == [tmp_path / "first"]  # built once
    assert (tmp_path / "second" / "model.safetensors").read_bytes() == b"weights"
    assert [p.name for p in folder.iterdir()] == [cache_key(7, V)]  # no partial copy left beside it


def test_a_failed_build_is_not_kept_and_another_seed_is_another_key(tmp_path: Path) -> None:
    calls: list[Path] = []
    folder = tmp_path / "cache"
    assert build_or_copy(tmp_path / "failed", 1, V, _builder(calls, code=3), folder) == 3
    assert not folder.exists()
    assert cache_key(1, V) != cache_key(2, V) and cache_key(1, V) == cache_key(1, V)
    assert cache_key(1, V) != cache_key(1, AGENT_VARIANT)
    build_or_copy(tmp_path / "one", 1, V, _builder(calls), folder)
    build_or_copy(tmp_path / "two", 2, V, _builder(calls), folder)
    assert len(calls) == 3 and sorted(p.name for p in folder.iterdir()) == sorted([cache_key(1, V), cache_key(2, V)])


def test_without_a_cache_folder_every_build_builds(tmp_path: Path) -> None:
    calls: list[Path] = []
    build_or_copy(tmp_path / "a", 0, V, _builder(calls), None)
    build_or_copy(tmp_path / "b", 0, V, _builder(calls), None)
    assert calls == [tmp_path / "a", tmp_path / "b"]


def test_a_cache_that_cannot_be_written_leaves_the_build_done_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[Path] = []
    not_a_folder = tmp_path / "cache"
    not_a_folder.write_text("a file where the cache folder should be")
    assert build_or_copy(tmp_path / "out", 0, V, _builder(calls), not_a_folder) == 0
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == b"weights"
    assert "not kept in $RLBUILD_BASE_MODEL_CACHE" in capsys.readouterr().err
