"""The base_model stage's cache: a build is kept whole under the digest of what builds it and copied from there;
a failed build is not kept; another seed or variant is another key; two builds of one key at once build once."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
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


def _kept(folder: Path) -> list[str]:
    """What the cache folder holds besides its lock files: kept builds, and any partial copy."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def test_a_build_is_kept_and_the_next_one_copies_it(tmp_path: Path) -> None:
    calls: list[Path] = []
    folder = tmp_path / "cache"
    assert build_or_copy(tmp_path / "first", 7, V, _builder(calls), folder) == 0
    assert build_or_copy(tmp_path / "second", 7, V, _builder(calls), folder) == 0
    assert calls == [tmp_path / "first"]  # built once
    assert (tmp_path / "second" / "model.safetensors").read_bytes() == b"weights"
    assert _kept(folder) == [cache_key(7, V)]  # no partial copy left beside it


def test_a_failed_build_is_not_kept_and_another_seed_is_another_key(tmp_path: Path) -> None:
    calls: list[Path] = []
    folder = tmp_path / "cache"
    assert build_or_copy(tmp_path / "failed", 1, V, _builder(calls, code=3), folder) == 3
    assert _kept(folder) == []
    assert cache_key(1, V) != cache_key(2, V) and cache_key(1, V) == cache_key(1, V)
    assert cache_key(1, V) != cache_key(1, AGENT_VARIANT)
    build_or_copy(tmp_path / "one", 1, V, _builder(calls), folder)
    build_or_copy(tmp_path / "two", 2, V, _builder(calls), folder)
    assert len(calls) == 3 and _kept(folder) == sorted([cache_key(1, V), cache_key(2, V)])


def test_two_builds_of_one_key_at_once_build_it_once(tmp_path: Path) -> None:
    calls: list[Path] = []
    building = threading.Event()
    inner = _builder(calls)

    def slow(out: Path) -> int:  # the second caller arrives while the first is building
        building.set()
        time.sleep(0.5)
        return inner(out)

    folder = tmp_path / "cache"
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(build_or_copy, tmp_path / "first", 3, V, slow, folder)
        assert building.wait(10)
        second = pool.submit(build_or_copy, tmp_path / "second", 3, V, slow, folder)
        assert (first.result(), second.result()) == (0, 0)
    assert calls == [tmp_path / "first"]  # the second waited and copied
    assert (tmp_path / "second" / "model.safetensors").read_bytes() == b"weights"


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
