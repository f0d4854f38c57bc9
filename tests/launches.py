"""Launch documents for trainer tests, made the way the graph makes them.

`write_test_launch(tmp_path, ...)` writes a small experiment (the tiny default's shape), stages the tiny base
model and a built-in task's rows with rlbuild's own staging code, resolves the version with rlbuild's own
builder, and writes `launch.yaml` under tmp_path. Role-plan changes go into `role_plan`/`topology`, recipe
changes into `recipe`, as in an experiment file.
"""

from __future__ import annotations

import copy
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from rlbuild.contracts.launch import dump_launch
from rlbuild.contracts.rows import dump_rows
from rlbuild.contracts.sources import parse_source
from rlbuild.contracts.tinymodel import TINY_MODEL_FILE
from rlbuild.core import storage
from rlbuild.plan.resolve import resolve
from rlbuild.plan.spec import parse_experiment
from rlbuild.stages.staging import stage_data, stage_model
from trainer import tasks, tiny

REPO = Path(__file__).resolve().parent.parent
TEST_ROLE_PLAN: dict[str, Any] = {
    "train_batch_size": 4,
    "policy_mini_batch_size": 4,
    "micro_train_batch_size_per_gpu": 16,
    "n_samples_per_prompt": 8,
}
TEST_RECIPE: dict[str, Any] = {
    "trainer": {"max_steps": 2, "ckpt_interval": 1, "eval_interval": -1, "eval_before_train": False},
}


def base_model_dir(seed: int = 0) -> Path:
    """The tiny warm-started base model, built once per tiny.py source, architecture and seed, cached in the temp
    folder."""
    key = hashlib.sha256(Path(tiny.__file__).read_bytes() + TINY_MODEL_FILE.read_bytes()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / f"rlbuild-tiny-base-{key}-{seed}"
    if not (folder / "config.json").exists():
        partial = Path(tempfile.mkdtemp(prefix=f"{folder.name}.partial-", dir=folder.parent))
        tiny.build_base_model(partial, seed)
        try:
            partial.rename(folder)
        except OSError:  # another test process finished first; use its copy
            shutil.rmtree(partial, ignore_errors=True)
    return folder


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in update.items():
        nested = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = deep_merge(merged[key], value) if nested else copy.deepcopy(value)
    return merged


def experiment_document(
    sources: Path,
    *,
    task: str = "addition",
    seed: int = 0,
    data_seed: int | None = None,
    recipe: dict[str, Any] | None = None,
    role_plan: dict[str, Any] | None = None,
    topology: dict[str, Any] | None = None,
    retention: dict[str, Any] | None = None,
    execution: dict[str, Any] | None = None,
    model_dir: Path | None = None,
) -> dict[str, Any]:
    """An experiment document: the tiny default's shape, local sources under `sources`, the test batch sizes.

    The task's split is revision `seed-<data_seed>` (default: the seed), the base model that of `seed` (or the HF
    folder `model_dir`).
    """
    doc = yaml.safe_load((REPO / "config" / "experiments" / "tiny-addition.yaml").read_text())
    model = f"local:{model_dir or base_model_dir(seed)}"
    data_seed = seed if data_seed is None else data_seed
    doc.update(name="test", seed=seed)
    doc["model"] = {"source": model, "revision": "tiny", "tokenizer": {"source": model, "revision": "tiny"}}
    doc["data"] = {
        split: [{"source": f"local:{_task_file(sources, task, split, data_seed)}", "revision": f"seed-{data_seed}"}]
        for split in tasks.SPLITS
    }
    doc["role_plan"] = {**doc["role_plan"], **TEST_ROLE_PLAN, **(role_plan or {})}
    doc["topology"] = {**doc["topology"], **(topology or {})}
    doc["retention"] = {**doc["retention"], **(retention or {})}
    doc["execution"] = {**doc["execution"], **(execution or {})}
    doc["recipe"] = deep_merge(TEST_RECIPE, recipe or {})
    return doc


def _task_file(folder: Path, task: str, split: str, seed: int) -> Path:
    path = folder / f"{task}-{split}-seed-{seed}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump_rows(tasks.generate(task, split, f"seed-{seed}")))
    return path


def write_test_launch(tmp_path: Path, *, version: str = "dev", storage_root: str | None = None, **changes: Any) -> Path:
    """Stage the tiny model and task data, resolve the launch document, write it under tmp_path; returns its path.

    Artifacts go under `storage_root` (a local folder or s3:// URI; default: tmp_path/storage)."""
    root = Path(tmp_path).resolve()
    experiment = parse_experiment(experiment_document(root / "sources", **changes), "test experiment")
    plan = resolve(experiment, version, storage_root or str(root / "storage"))
    model, data = experiment.model, experiment.data
    staged = root / "staged"
    stage_model(
        parse_source(model.source, model.revision),
        parse_source(model.tokenizer.source, model.tokenizer.revision),
        staged / "model",
    )
    stage_data(
        [parse_source(d.source, d.revision) for d in data.train],
        [parse_source(d.source, d.revision) for d in data.validation],
        staged / "data",
    )
    storage.put_dir(staged / "model", plan.launch.inputs.model.uri)
    storage.put_dir(staged / "data", plan.launch.inputs.train_data[0].uri.rsplit("/", 2)[0])
    path = root / "launch.yaml"
    path.write_text(dump_launch(plan.launch))
    return path


def placeable(gpu_bundles: int) -> pytest.MarkDecorator:
    """Skip a test whose roles take `gpu_bundles` GPUs on a machine with fewer. Without GPUs a bundle is a CPU and
    the test runs; with enough GPUs it runs on them (FSDP2 over NCCL, the engines on CUDA)."""
    gpus = torch.cuda.device_count()
    reason = f"the test places {gpu_bundles} GPU bundles and this machine has {gpus} GPU(s)"
    return pytest.mark.skipif(0 < gpus < gpu_bundles, reason=reason)
