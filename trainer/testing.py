"""Test helper: a complete, staged launch document for the tiny default, in a temporary folder.

`write_test_launch(tmp_path, **overrides)` builds (or reuses) the tiny base model, stages it and a task's data
with manifests like the stage rules do, and writes `launch.yaml`. Overrides are deep-merged into the document
by section, e.g. `trainer={"trainer": {"max_steps": 3}}` or `artifacts={"resume_checkpoint_count": 1}`.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from rlbuild.staging import write_manifest
from trainer import tasks, tiny
from trainer.config import deep_merge

TEST_RECIPE: dict[str, Any] = {
    "trainer": {
        "train_batch_size": 4,
        "policy_mini_batch_size": 4,
        "micro_train_batch_size_per_gpu": 16,
        "max_steps": 2,
        "ckpt_interval": 1,
        "eval_interval": -1,
        "eval_before_train": False,
    },
    "generator": {"n_samples_per_prompt": 8},
}


def base_model_dir(seed: int = 0) -> Path:
    """The tiny warm-started base model, built once per tiny.py source and seed, cached in the temp folder."""
    key = hashlib.sha256(Path(tiny.__file__).read_bytes()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"rlbuild-tiny-base-{key}-{seed}"
    if not (folder / "config.json").exists():
        partial = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=folder.parent))
        tiny.build_base_model(partial, seed)
        try:
            partial.rename(folder)
        except OSError:  # another test process finished first; use its copy
            shutil.rmtree(partial, ignore_errors=True)
    return folder


def write_test_launch(tmp_path: Path, task: str = "addition", seed: int = 0, **overrides: Any) -> Path:
    """Stage the tiny model and `task` data under tmp_path and write tmp_path/launch.yaml; returns its path."""
    from rlbuild.identity import runtime_source_digest

    root = Path(tmp_path).resolve()
    model = root / "stage" / "model" / "vdev"
    shutil.copytree(base_model_dir(seed), model, dirs_exist_ok=True)
    write_manifest(model)
    data = root / "stage" / "data" / "vdev"
    for split in tasks.SPLITS:
        tasks.write_jsonl(tasks.generate(task, split, f"seed-{seed}"), data / split / "0.jsonl")
    write_manifest(data)
    temporary = root / "tmp" / "ttl=14d" / "train" / "vdev"
    document: dict[str, Any] = {
        "schema_version": 1,
        "run": {
            "id": "test-dev",
            "name": "test",
            "version": "dev",
            "seed": seed,
            "mode": "train",
            "fingerprint": "0" * 16,
            "export_hf": True,
        },
        "runtime": {"entrypoint": "grpo", "strategy": "fsdp2", "source_digest": runtime_source_digest()},
        "iris": {"cluster": "local"},
        "ingress": {"mode": "direct", "vllm_http_port": 8000},
        "ray": {
            "address": None,
            "port": 6379,
            "rendezvous_dir": str(temporary / "attempts" / "rendezvous"),
            "rendezvous_timeout_s": 60,
            "cluster_join_timeout_s": 60,
        },
        "artifacts": {
            "experiment_root": str(root),
            "checkpoint_root": str(temporary / "checkpoints"),
            "attempts_root": str(temporary / "attempts"),
            "export_root": str(root / "export" / "vdev"),
            "terminal_manifest_uri": str(root / "train" / "vdev" / "terminal.json"),
            "metrics_uri": str(temporary / "checkpoints" / "metrics.jsonl"),
            "resume_checkpoint_count": 2,
            "temporary_storage_ttl_days": 14,
        },
        "inputs": {
            "model": {
                "uri": str(model),
                "identity": "test/stage_model@dev:0",
                "tokenizer_uri": str(model),
                "tokenizer_revision": "tiny",
                "local_path": None,
            },
            "train_data": [
                {"uri": str(data / "train" / "0.jsonl"), "identity": "test/stage_data@dev:0", "kind": "jsonl"}
            ],
            "validation_data": [
                {"uri": str(data / "validation" / "0.jsonl"), "identity": "test/stage_data@dev:0", "kind": "jsonl"}
            ],
        },
        "trainer": deep_merge(TEST_RECIPE, {"trainer": {"seed": seed}}),
    }
    document = deep_merge(document, overrides)
    path = root / "launch.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path
