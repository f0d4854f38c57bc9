"""Checkpoint layout, retention, resume modes, the digest guard and the immutability guard (no Ray)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from rlbuild.contracts import runtime
from rlbuild.contracts.artifacts import CorruptDocumentError, artifact
from rlbuild.contracts.checkpoints import CheckpointLayoutError, read_state
from rlbuild.contracts.launch import LaunchDocument, load_launch
from rlbuild.contracts.manifest import ManifestMismatchError, describe_files, payload_files
from rlbuild.core import storage
from rlbuild.dev.built import write_built
from rlbuild.dev.launches import write_test_launch
from rlbuild.job.attempt import run_logged
from rlbuild.ops.status import Options, version_status
from rlbuild.plan.preflight import load_experiment
from rlbuild.plan.resolve import resolve
from trainer import loop, tiny
from trainer.checkpoint import CheckpointError, CheckpointManager
from trainer.errors import TrainerError
from trainer.workers import sharding

EXPERIMENT = Path(__file__).resolve().parents[2] / "config" / "experiments" / "tiny-addition.yaml"
VERSION = "2026.09.21"


def _write_policy(uri: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "policy").mkdir()
        (Path(tmp) / "policy" / "model.safetensors").write_text("weights")
        (Path(tmp) / "optimizer.pt").write_text("adam")
        storage.put_dir(Path(tmp), uri)
        return describe_files(dict(payload_files(Path(tmp))))["files"]


def _exercise(root: str) -> None:
    manager = CheckpointManager(root, keep=2, runtime_digest="d1")
    assert manager.latest_step() is None
    assert manager.resolve("latest", None) is None
    for step in (2, 4, 6):
        manager.save(step, data_cursor=step * 16, extra={"seed": 0}, write_policy=_write_policy)
    assert manager.latest_step() == 6
    names = sorted(n for n in storage.list_names(root) if n.startswith("global_step_"))
    assert names == ["global_step_4", "global_step_6"]
    resume = manager.resolve("latest", None)
    assert (resume.step, resume.data_cursor, resume.uri) == (6, 96, manager.step_uri(6))
    assert set(resume.files) == {"policy/model.safetensors", "optimizer.pt", "trainer_state.json"}
    assert resume.files["optimizer.pt"]["size"] == 4
    state_uri = storage.join(manager.step_uri(6), "trainer_state.json")
    state = json.loads(storage.read_text(state_uri))
    assert state["runtime_source_digest"] == "d1" and state["global_step"] == 6
    # One edited byte of the state (the data cursor 96 -> 97) is refused by the next reader, naming the file.
    storage.write_text(state_uri, storage.read_text(state_uri).replace('"data_cursor": 96', '"data_cursor": 97'))
    with pytest.raises(CorruptDocumentError, match=r"trainer_state\.json is corrupt: .*manifest lists"):
        manager.resolve("latest", None)
    with pytest.raises(CorruptDocumentError, match=r"trainer_state\.json is corrupt"):
        read_state(manager.step_uri(6))
    storage.write_text(state_uri, json.dumps(state, indent=2))  # restored byte for byte
    assert storage.exists(storage.join(manager.step_uri(6), "policy", "model.safetensors"))
    assert manager.resolve("none", None) is None
    assert manager.resolve("from_path", manager.step_uri(4)).step == 4
    other_code = CheckpointManager(root, keep=2, runtime_digest="d2")
    with pytest.raises(CheckpointError, match=r"runtime source digest d1.*running code has d2"):
        other_code.resolve("latest", None)


def test_local_checkpoints(tmp_path: Path) -> None:
    _exercise(str(tmp_path / "checkpoints"))


def test_s3_checkpoints(s3_root: str) -> None:
    _exercise(f"{s3_root}/exp/tmp/ttl=14d/train/v1/checkpoints")


def test_resume_errors(tmp_path: Path) -> None:
    manager = CheckpointManager(str(tmp_path), keep=1, runtime_digest="d")
    with pytest.raises(CheckpointError, match=r"resume_path='/x/step3'"):
        manager.resolve("from_path", "/x/step3")
    (tmp_path / "global_step_3").mkdir()
    with pytest.raises(CheckpointError, match=r"no trainer_state\.json"):
        manager.resolve("from_path", str(tmp_path / "global_step_3"))
    (tmp_path / "global_step_3" / "trainer_state.json").write_text('{"global_step": 3, "data_cursor": 0}')
    with pytest.raises(CheckpointError, match=r"global_step_3 has no manifest\.json.*Resume another checkpoint"):
        manager.resolve("from_path", str(tmp_path / "global_step_3"))
    (tmp_path / "latest").write_text("three")
    with pytest.raises(CheckpointLayoutError, match="not a step number"):
        manager.latest_step()


def _launch(tmp_path: Path, version: str) -> LaunchDocument:
    path = write_test_launch(tmp_path / version, version=version, recipe={"trainer": {"max_steps": 4}})
    return load_launch(str(path))


def test_a_completed_final_checkpoint_gets_its_terminal_manifest_without_training(tmp_path: Path) -> None:
    launch = _launch(tmp_path, "2026.09.21")
    root, keep = launch.artifacts.checkpoint_root, launch.artifacts.resume_checkpoint_count
    manager = CheckpointManager(root, keep, runtime.source_digest(), launch.run.fingerprint)
    manager.save(4, 64, {}, _write_policy)
    terminal = tmp_path / "terminal.json"
    manifest = loop.run(launch, str(terminal))  # no Ray starts: nothing is left to train
    assert manifest["global_step"] == 4 == json.loads(terminal.read_text())["global_step"]
    assert manifest["hf_path"] == f"{root}/global_step_4/policy"
    assert loop.start_point(launch, str(tmp_path / "other.json"), manager, True) is None  # allow_retrain: step 0


def test_the_terminal_manifest_is_written_only_from_a_verified_checkpoint(tmp_path: Path) -> None:
    launch = _launch(tmp_path, "2026.09.21")
    manager = CheckpointManager(launch.artifacts.checkpoint_root, 1, runtime.source_digest(), launch.run.fingerprint)
    uri = manager.save(4, 64, {}, _write_policy)
    Path(uri, "policy", "model.safetensors").write_text("weightz")  # one byte
    terminal = tmp_path / "terminal.json"
    with pytest.raises(ManifestMismatchError, match=r"policy/model\.safetensors"):
        loop.run(launch, str(terminal))
    assert not terminal.exists()


def test_latest_never_resumes_another_configurations_checkpoint(tmp_path: Path) -> None:
    CheckpointManager(str(tmp_path), 1, "d", launch_fingerprint="a" * 16).save(2, 8, {}, _write_policy)
    with pytest.raises(CheckpointError, match=r"belongs to launch fingerprint a{16}, not this launch's b{16}"):
        CheckpointManager(str(tmp_path), 1, "d", launch_fingerprint="b" * 16).resolve("latest", None)
    explicit = CheckpointManager(str(tmp_path), 1, "d", launch_fingerprint="b" * 16)
    assert explicit.resolve("from_path", str(tmp_path / "global_step_2")).step == 2  # an explicit choice


def test_existing_terminal_manifest_is_never_overwritten(tmp_path: Path) -> None:
    launch = _launch(tmp_path, "dev")
    terminal = tmp_path / "terminal.json"
    terminal.write_text("{}")
    manager = CheckpointManager(launch.artifacts.checkpoint_root, keep=1, runtime_digest="d")
    with pytest.raises(TrainerError, match="already exists"):
        loop.start_point(launch, str(terminal), manager, True)


def _training_state(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    model = tiny.build_model(tiny.build_tokenizer(), seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda n: 1.0 / (n + 1))


def test_a_sharded_checkpoint_round_trips_through_s3(s3_root: str) -> None:
    """What a rank writes with torch.distributed.checkpoint through fsspec, with rlbuild.core.storage's S3 settings."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model, optimizer, scheduler = _training_state(seed=0)
        for _ in range(2):
            model(input_ids=torch.tensor([[1, 5, 6, 7]]), labels=torch.tensor([[1, 5, 6, 7]])).loss.backward()
            optimizer.step()
            scheduler.step()
        uri = f"{s3_root}/ckpt/global_step_2/sharded"
        sharding.save(uri, model, optimizer, scheduler)
        assert {".metadata", "__0_0.distcp"} <= set(storage.list_names(uri))
        restored, restored_optimizer, restored_scheduler = _training_state(seed=1)
        sharding.load(uri, restored, restored_optimizer, restored_scheduler)
    finally:
        dist.destroy_process_group()
    for name, value in model.state_dict().items():
        assert torch.equal(restored.state_dict()[name], value), name
    saved, loaded = optimizer.state_dict()["state"], restored_optimizer.state_dict()["state"]
    assert all(torch.equal(saved[i]["exp_avg_sq"], loaded[i]["exp_avg_sq"]) for i in saved)
    assert restored_scheduler.last_epoch == 2 and restored_scheduler.get_last_lr() == scheduler.get_last_lr()


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a disk that a checkpoint fills. Mounting needs root (CI runs as root); skipped elsewhere."""
    if os.geteuid() != 0:
        pytest.skip("mounting a 1 MiB tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"this root cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", str(disk)], check=True)


# A training attempt whose checkpoint of step 4 (2 MiB of policy) meets a full disk, as `rlbuild train` runs it.
FILLS_THE_DISK = """
import os, sys
from pathlib import Path
from trainer.__main__ import failure_line
from trainer.checkpoint import CheckpointManager
from trainer.errors import TrainerError

def write_policy(uri):
    Path(uri, "policy").mkdir(parents=True)
    Path(uri, "policy", "model.safetensors").write_bytes(os.urandom(2 << 20))
    return {}

try:
    CheckpointManager(sys.argv[1], 2, "digest").save(4, 0, {}, write_policy)
except TrainerError as error:
    print(failure_line(error), flush=True)
    sys.exit(2)
"""


def test_a_full_disk_at_a_checkpoint_is_a_failed_train_naming_the_cause(small_disk: Path) -> None:
    """The kernel's ENOSPC at a checkpoint: what was written of it is removed (nothing half-written, and room for
    the attempt's log), the attempt's log says why, and `rlbuild status` shows train `failed` with that cause."""
    root = str(small_disk / "results")
    write_built(EXPERIMENT, root, [VERSION])
    plan = resolve(load_experiment(EXPERIMENT), VERSION, root)
    for kind in ("train", "export", "eval"):  # as Snakemake leaves an artifact it reruns: no record
        storage.remove(plan.uri(artifact(kind).record(VERSION)))
    a = plan.launch.artifacts
    assert run_logged([sys.executable, "-c", FILLS_THE_DISK, a.checkpoint_root], a.attempts_root) == 2
    step = f"{a.checkpoint_root}/global_step_4"
    assert not os.path.exists(step)
    train = version_status(plan, {}, ["train"], Options(), time.time())["train"]
    assert train["state"] == "failed", train
    assert train["verdict"].startswith(f"failed: no space left on device writing {step} (attempt "), train["verdict"]
