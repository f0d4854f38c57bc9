"""Valid experiment documents used across spine tests (the seed's worked examples)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

SEED_64_GPU: dict[str, Any] = {
    "name": "seed-64",
    "seed": 42,
    "runtime": {"entrypoint": "grpo", "strategy": "fsdp2"},
    "model": {
        "source": "hf:Qwen/Qwen3-8B",
        "revision": "0123456789abcdef0123456789abcdef01234567",
        "tokenizer": {"source": "hf:Qwen/Qwen3-8B", "revision": "0123456789abcdef0123456789abcdef01234567"},
    },
    "data": {
        "train": [{"source": "task:addition/train", "revision": "seed-0"}],
        "validation": [{"source": "task:addition/validation", "revision": "seed-0"}],
    },
    "topology": {"num_nodes": 8, "gpus_per_node": 8, "gpu_variant": "H100"},
    "role_plan": {
        "colocate_all": False,
        "policy_num_nodes": 4,
        "policy_num_gpus_per_node": 8,
        "ref_num_nodes": 0,
        "num_inference_engines": 4,
        "inference_engine_tensor_parallel_size": 1,
        "inference_engine_pipeline_parallel_size": 1,
        "inference_engine_data_parallel_size": 8,
        "inference_engine_expert_parallel_size": 1,
        "train_batch_size": 64,
        "policy_mini_batch_size": 16,
        "micro_train_batch_size_per_gpu": 2,
        "n_samples_per_prompt": 8,
    },
    "retention": {"resume_checkpoint_count": 2, "temporary_storage_ttl_days": 14},
    "recipe": {},
    "execution": {
        "iris": {
            "cluster": "coreweave",
            "cpu": 48,
            "memory": "512GB",
            "disk": "512GB",
            "priority": "interactive",
            "max_retries": 1,
        }
    },
}


def experiment(**changes: Any) -> dict[str, Any]:
    """A deep copy of the 64-GPU seed example with dotted-path changes applied."""
    doc = copy.deepcopy(SEED_64_GPU)
    for dotted, value in changes.items():
        set_path(doc, dotted, value)
    recipe = doc.get("recipe")
    if isinstance(recipe, dict) and isinstance(recipe.setdefault("generator", {}), dict):
        # The test runtime has no vLLM, so `auto` on H100s is refused (preflight.check_backend): HF generate.
        recipe["generator"].setdefault("backend", "torch")
    return doc


def set_path(doc: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split("__")
    node = doc
    for key in parents:
        node = node.setdefault(key, {})
    if value is DELETE:
        node.pop(leaf)
    else:
        node[leaf] = value


DELETE = object()


def write(tmp_path: Path, doc: dict[str, Any], name: str = "exp.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
