"""Materialising staged directories from storage (local folder and moto S3), verified against manifests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlbuild.contracts.launch import Input, Inputs, LaunchDocument, load_launch
from rlbuild.contracts.manifest import ManifestError, ManifestMismatchError, materialise, materialise_inputs
from rlbuild.contracts.sources import parse_source
from rlbuild.core.storage import filesystem
from rlbuild.dev.launches import write_test_launch
from rlbuild.stages.staging import stage_data, stage_model
from tests.staging.conftest import write_model_folder


@pytest.fixture
def staged(tmp_path: Path) -> Path:
    """An experiment root with a staged model and staged data, as the stage rules leave it."""
    root = tmp_path / "results" / "tiny"
    src = parse_source(f"local:{write_model_folder(tmp_path / 'src-model', b'weights')}", "v1")
    stage_model(src, src, root / "stage/model/v1")
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "answer": str(2 * i)}) + "\n" for i in range(5)))
    stage_data([parse_source(f"local:{data}", "v1")], [parse_source(f"local:{data}", "v1")], root / "stage/data/v1")
    for d in ("stage/model/v1", "stage/data/v1"):
        (root / d / ".snakemake_timestamp").write_text("")  # Snakemake's marker in directory outputs
    return root


@pytest.fixture(scope="module")
def any_launch(tmp_path_factory: pytest.TempPathFactory) -> LaunchDocument:
    return load_launch(str(write_test_launch(tmp_path_factory.mktemp("launch"))))


def _launch(template: LaunchDocument, base: str) -> LaunchDocument:
    """A launch document whose inputs point into the staged folders under `base`."""
    inputs = Inputs(
        model=Input(uri=f"{base}/stage/model/v1", identity="x"),
        train_data=[Input(uri=f"{base}/stage/data/v1/train/0.jsonl", identity="y")],
        validation_data=[Input(uri=f"{base}/stage/data/v1/validation/0.jsonl", identity="y")],
    )
    return template.model_copy(update={"inputs": inputs})


def test_materialise_local_and_reuse(staged: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    local = materialise(str(staged / "stage/data/v1/train/0.jsonl"), cache)
    assert local.read_bytes() == (staged / "stage/data/v1/train/0.jsonl").read_bytes()
    assert local.is_relative_to(cache) and (local.parent.parent / "manifest.json").is_file()
    assert materialise(str(staged / "stage/data/v1/validation/0.jsonl"), cache).parent.parent == local.parent.parent

    local.write_text("tampered on the node\n")
    with pytest.raises(ManifestMismatchError, match=r"(?s)cached copy .*train/0\.jsonl: size.*never replaced silently"):
        materialise(str(staged / "stage/data/v1/train/0.jsonl"), cache)


def test_concurrent_materialise_shares_one_verified_copy(staged: Path, tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    uri = str(staged / "stage/model/v1")
    with ThreadPoolExecutor(4) as pool:
        copies = list(pool.map(lambda _: materialise(uri, tmp_path / "cache"), range(4)))
    assert len(set(copies)) == 1
    assert [p.name for p in copies[0].parent.iterdir()] == ["v1"]  # no partial copies left behind


def test_materialise_needs_a_staged_directory(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    with pytest.raises(ManifestError, match=r"no manifest\.json at or above"):
        materialise(str(tmp_path / "plain"), tmp_path / "cache")
    with pytest.raises(ManifestError, match="relative"):
        materialise("results/tiny/stage/model/v1", tmp_path / "cache")


def test_materialise_inputs_of_a_launch_document(staged: Path, tmp_path: Path, any_launch: LaunchDocument) -> None:
    paths = materialise_inputs(_launch(any_launch, str(staged)), tmp_path / "cache")
    assert (paths["model"] / "model.safetensors").read_bytes() == b"weights"
    assert (paths["model"] / "tokenizer.json").is_file()  # the staged model folder carries its tokenizer
    assert [p.name for p in paths["train_data"]] == ["0.jsonl"]
    assert paths["validation_data"][0].parent.name == "validation"


def _upload(staged: Path, bucket: str) -> str:
    fs, _ = filesystem(bucket)
    base = f"{bucket}/exp/tiny"
    for path in sorted(p for p in staged.rglob("*") if p.is_file()):
        fs.put_file(str(path), f"{base}/{path.relative_to(staged).as_posix()}")
    return base


def test_materialise_from_s3_then_tamper(staged: Path, tmp_path: Path, s3_env: str, any_launch: LaunchDocument) -> None:
    base = _upload(staged, s3_env)
    paths = materialise_inputs(_launch(any_launch, base), tmp_path / "cache")
    assert (paths["model"] / "model.safetensors").read_bytes() == b"weights"
    assert paths["model"] == tmp_path / f"cache/s3/{s3_env.removeprefix('s3://')}/exp/tiny/stage/model/v1"
    assert paths["train_data"][0].read_bytes() == (staged / "stage/data/v1/train/0.jsonl").read_bytes()
    assert not (paths["model"] / ".snakemake_timestamp").exists()  # Snakemake's marker is not payload

    fs, _ = filesystem(s3_env)
    fs.pipe_file(f"{base}/stage/model/v1/model.safetensors", b"WEIGHTS")  # same size, other bytes
    fs.pipe_file(f"{base}/stage/model/v1/stray.txt", b"?")
    fs.rm_file(f"{base}/stage/model/v1/config.json")
    with pytest.raises(ManifestMismatchError) as info:
        materialise(f"{base}/stage/model/v1", tmp_path / "fresh-cache")
    assert sorted(info.value.problems) == [
        "config.json: missing",
        "model.safetensors: sha256 " + info.value.problems[-1].split("sha256 ")[1],
        "stray.txt: extra file not in the manifest",
    ]
    assert not list((tmp_path / "fresh-cache").rglob("*.safetensors"))  # nothing half-materialised
