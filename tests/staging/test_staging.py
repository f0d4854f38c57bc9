"""Staging models and data into a folder with a manifest, and verifying it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlbuild.contracts.manifest import (
    ManifestError,
    ManifestMismatchError,
    manifest_digest,
    verify_manifest,
    write_manifest,
)
from rlbuild.contracts.sources import REPO_ROOT, SourceError, StagingError, parse_source
from rlbuild.stages.staging import local_content_digest, stage_data, stage_model
from tests.staging.conftest import REPO, SHA_A, SHA_B, add_hf_snapshot, write_model_folder


def test_parse_source_grammar() -> None:
    src = parse_source("hf:acme/tiny-model", SHA_A)
    assert (src.scheme, src.location, src.revision, src.hf_repo_id) == ("hf", REPO, SHA_A, REPO)
    assert parse_source("hf:acme/data/train/part.parquet", SHA_A).hf_subpath == "train/part.parquet"
    assert parse_source("task:addition/train", "seed-0").task == ("addition", "train")
    assert parse_source("artifact:base_model", "v").check() == []
    for bad in ("gs://bucket/x", "hf:just-a-name", "artifact:base-model/x", "task:addition", "local:"):
        with pytest.raises(SourceError):
            parse_source(bad, "r")


def test_check_refuses_branch_names_and_missing_paths() -> None:
    (problem,) = parse_source("hf:acme/tiny-model", "main").check()
    assert "'main'" in problem and "moves" in problem and "commit sha" in problem and "model_info" in problem
    assert parse_source("hf:acme/tiny-model", SHA_A.upper()).check()
    (problem,) = parse_source("local:no/such/dir", "v1").check()
    assert str(REPO_ROOT / "no/such/dir") in problem
    assert parse_source("local:config", "v1").check() == []  # relative to the repo root
    assert parse_source("task:addition/train", " ").check()


def test_stage_model_from_offline_hf_cache(hf_cache: Path, tmp_path: Path) -> None:
    src = parse_source(f"hf:{REPO}", SHA_A)
    manifest = stage_model(src, src, tmp_path / "out")
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors", "tokenizer.json"]
    out = tmp_path / "out"
    assert (out / "model.safetensors").read_bytes() == b"weights at A"
    assert not (out / "model.safetensors").is_symlink()
    assert json.loads((out / "manifest.json").read_text()) == manifest
    verify_manifest(out)


def test_branch_name_is_refused(hf_cache: Path, tmp_path: Path) -> None:
    src = parse_source(f"hf:{REPO}", "main")
    with pytest.raises(SourceError, match="not a commit sha"):
        stage_model(src, src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_moved_revision_is_a_new_identity(hf_cache: Path, tmp_path: Path) -> None:
    a, b = parse_source(f"hf:{REPO}", SHA_A), parse_source(f"hf:{REPO}", SHA_B)
    assert a != b
    digest_a = manifest_digest(stage_model(a, a, tmp_path / "a"))
    digest_b = manifest_digest(stage_model(b, b, tmp_path / "b"))
    assert digest_a != digest_b


def test_uncached_revision_names_the_fix(hf_cache: Path, tmp_path: Path) -> None:
    src = parse_source(f"hf:{REPO}", "c" * 40)
    with pytest.raises(StagingError, match=r"not in the Hugging Face cache.*hf download"):
        stage_model(src, src, tmp_path / "out")


def test_stage_model_local_folder_with_separate_tokenizer(tmp_path: Path) -> None:
    model = write_model_folder(tmp_path / "model", b"W", vocab="model-vocab")
    tokenizer = write_model_folder(tmp_path / "tok", b"unused", vocab="tok-vocab")
    manifest = stage_model(
        parse_source(f"local:{model}", "v1"), parse_source(f"local:{tokenizer}", "t1"), tmp_path / "out"
    )
    out = tmp_path / "out"
    assert sorted(manifest["files"]) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((out / "tokenizer.json").read_text())["vocab"] == "tok-vocab"
    assert (out / "model.safetensors").read_bytes() == b"W"


def test_stage_model_from_artifact(tmp_path: Path) -> None:
    base = write_model_folder(tmp_path / "base_model" / "vdev", b"tiny")
    src = parse_source("artifact:base_model", "tiny-qwen2")
    stage_model(src, src, tmp_path / "out", artifact_dirs={"base_model": base})
    assert (tmp_path / "out" / "model.safetensors").read_bytes() == b"tiny"
    with pytest.raises(SourceError, match="artifact_dirs"):
        stage_model(src, src, tmp_path / "out2")


def test_stage_model_needs_config_and_empty_out_dir(tmp_path: Path) -> None:
    (tmp_path / "notamodel").mkdir()
    src = parse_source(f"local:{tmp_path / 'notamodel'}", "v1")
    with pytest.raises(StagingError, match=r"no config\.json"):
        stage_model(src, src, tmp_path / "out")
    model = write_model_folder(tmp_path / "model", b"W")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "stale").write_text("x")
    src = parse_source(f"local:{model}", "v1")
    with pytest.raises(StagingError, match="not empty"):
        stage_model(src, src, tmp_path / "busy")


def _rows(n: int) -> list[dict[str, object]]:
    return [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(n)]


def test_stage_data_jsonl_and_parquet(tmp_path: Path) -> None:
    jsonl = tmp_path / "train.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in _rows(3)))
    parquet = tmp_path / "val.parquet"
    pq.write_table(pa.Table.from_pylist([{**r, "extra": 1} for r in _rows(2)]), parquet)
    manifest = stage_data(
        [parse_source(f"local:{jsonl}", "v1")], [parse_source(f"local:{parquet}", "v1")], tmp_path / "out"
    )
    assert sorted(manifest["files"]) == ["train/0.jsonl", "validation/0.jsonl"]
    val = [json.loads(line) for line in (tmp_path / "out/validation/0.jsonl").read_text().splitlines()]
    assert val == _rows(2)  # parquet rows become {prompt, answer}
    verify_manifest(tmp_path / "out")


def test_parquet_missing_column_is_named(tmp_path: Path) -> None:
    parquet = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"prompt": "1+1=", "solution": "2"}]), parquet)
    with pytest.raises(StagingError, match=r"missing column\(s\) \['answer'\].*found \['prompt', 'solution'\]"):
        stage_data([parse_source(f"local:{parquet}", "v1")], [], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written left behind


def test_stage_data_from_task_generator(tmp_path: Path) -> None:
    from trainer.tasks import generate

    train = [parse_source("task:addition/train", "seed-0")]
    val = [parse_source("task:addition/validation", "seed-0")]
    first = stage_data(train, val, tmp_path / "a")
    second = stage_data(train, val, tmp_path / "b")
    assert first == second  # deterministic: the same revision gives the same bytes
    rows = [json.loads(line) for line in (tmp_path / "a/train/0.jsonl").read_text().splitlines()]
    assert rows == generate("addition", "train", "seed-0")


def test_verify_manifest_names_every_problem(tmp_path: Path) -> None:
    staged = write_model_folder(tmp_path / "staged", b"W")
    write_manifest(staged)
    (staged / ".snakemake_timestamp").write_text("")  # Snakemake's marker is not payload
    verify_manifest(staged)

    (staged / "model.safetensors").write_bytes(b"X")  # same size, other content
    (staged / "config.json").write_text("{}")  # other size
    (staged / "tokenizer.json").unlink()
    (staged / "sub").mkdir()
    (staged / "sub" / "stray.bin").write_bytes(b"?")
    with pytest.raises(ManifestMismatchError) as info:
        verify_manifest(staged)
    problems = info.value.problems
    assert len(problems) == 4
    text = str(info.value)
    for expected in (
        "model.safetensors: sha256",
        "config.json: size 2 bytes",
        "tokenizer.json: missing",
        "sub/stray.bin: extra file",
    ):
        assert expected in text


def test_verify_without_manifest_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="not a complete artifact"):
        verify_manifest(tmp_path)


def test_local_content_digest_follows_the_content(tmp_path: Path) -> None:
    model = write_model_folder(tmp_path / "model", b"W")
    src = parse_source(f"local:{model}", "v1")
    cache = tmp_path / "digests.json"
    before = local_content_digest(src, cache)
    assert before == manifest_digest(stage_model(src, src, tmp_path / "out"))
    assert local_content_digest(src, cache) == before  # from the cache this time
    (model / "model.safetensors").write_bytes(b"W2")
    assert local_content_digest(src, cache) != before
    with pytest.raises(SourceError):
        local_content_digest(parse_source("task:addition/train", "seed-0"))


def test_stage_data_from_offline_hf_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(_rows(3)), buffer)
    cache = tmp_path / "hf-cache"
    add_hf_snapshot(cache, "acme/sums", SHA_A, {"data/train.parquet": buffer.getvalue(), "README.md": b"x"})
    (cache / "models--acme--sums").rename(cache / "datasets--acme--sums")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    stage_data([parse_source("hf:acme/sums/data/train.parquet", SHA_A)], [], tmp_path / "out")
    rows = [json.loads(line) for line in (tmp_path / "out/train/0.jsonl").read_text().splitlines()]
    assert rows == _rows(3)


def test_unknown_task_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="task:subtraction/train"):
        stage_data([parse_source("task:subtraction/train", "seed-0")], [], tmp_path / "out")
    assert not (tmp_path / "out").exists()
