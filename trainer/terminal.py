"""terminal.json: the run's completion record, written once and last.

`{global_step, checkpoint_path, hf_path, checkpoint_manifest_sha256, export_path, runtime_source_digest, inputs,
metrics}`: `hf_path` is the terminal checkpoint's `policy/` folder (a complete Hugging Face model), which the export
rule publishes after checking it against the checkpoint's manifest, whose digest is recorded here.
"""

from __future__ import annotations

import json
from typing import Any

from rlbuild.contracts.checkpoints import HF_FOLDER
from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.manifest import manifest_digest, read_manifest
from rlbuild.core import storage
from trainer.checkpoint import CheckpointManager
from trainer.errors import TrainerError


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The terminal manifest's metrics: held-out accuracy before/after, and the last 10 steps' averages."""
    steps = [r for r in records if r["step"] > 0 and "reward/mean" in r]
    tail = steps[-10:]
    evals = [r for r in records if r.get("eval/accuracy") is not None]

    def mean(key: str, rows: list[dict[str, Any]]) -> float | None:
        values = [r[key] for r in rows if key in r]
        return sum(values) / len(values) if values else None

    return {
        "steps_logged": len(steps),
        "initial_eval_accuracy": evals[0]["eval/accuracy"] if evals and evals[0]["step"] == 0 else None,
        "final_eval_accuracy": evals[-1]["eval/accuracy"] if evals else None,
        "final_train_accuracy": evals[-1].get("eval/train_accuracy") if evals else None,
        "final_reward_mean": mean("reward/mean", tail),
        "final_frac_correct": mean("reward/frac_correct", tail),
        "final_kl": mean("policy/kl", tail),  # None when no KL was computed
        "longest_zero_reward_steps": max((r.get("health/zero_reward_steps", 0) for r in steps), default=0),
        "mean_step_time_s": mean("perf/step_time_s", steps),
        "total_step_time_s": sum(r["perf/step_time_s"] for r in steps),
    }


def write_terminal(
    launch: LaunchDocument, checkpoints: CheckpointManager, records: list[dict[str, Any]], terminal_uri: str
) -> dict[str, Any]:
    """Write terminal.json for the run's last checkpoint; refuses to overwrite one."""
    step = launch.recipe.trainer.max_steps
    checkpoint = checkpoints.step_uri(step)
    manifest = {
        "global_step": step,
        "checkpoint_path": checkpoint,
        "hf_path": storage.join(checkpoint, HF_FOLDER),
        # The checkpoint's manifest as it was when training finished: export refuses a manifest changed since.
        "checkpoint_manifest_sha256": manifest_digest(read_manifest(checkpoint)),
        "export_path": launch.artifacts.export_root,
        "runtime_source_digest": checkpoints.runtime_digest,
        "inputs": {
            "model": launch.inputs.model.identity,
            "data": sorted({entry.identity for entry in [*launch.inputs.train_data, *launch.inputs.validation_data]}),
        },
        "metrics": summarise(records),
    }
    if storage.exists(terminal_uri):
        raise TrainerError(f"terminal manifest {terminal_uri} appeared during training; refusing to overwrite it")
    storage.write_text(terminal_uri, json.dumps(manifest, indent=2) + "\n")
    return manifest
