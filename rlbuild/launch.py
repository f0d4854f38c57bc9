"""The launch document: the one YAML every stage after resolve_launch reads.

Sections: run, runtime, iris, ingress, ray, artifacts, inputs, trainer. Same inputs give byte-identical
output (no timestamps, sorted nothing that the user ordered). Secrets never appear in it.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from rlbuild.spec import Experiment
from rlbuild.storage import ArtifactPaths, join

SCHEMA_VERSION = 1
JOB_NAME_UNSAFE = re.compile(r"[^a-z0-9-]+")


def job_name(experiment: str, version: str, stage: str) -> str:
    """An Iris-safe job name (no '/', lower-case, dashes) that says experiment, version and stage."""
    raw = f"{experiment}-{version}-{stage}".lower().replace(".", "-")
    return JOB_NAME_UNSAFE.sub("-", raw).strip("-")[:63]


def build_launch(
    experiment: Experiment,
    version: str,
    *,
    experiment_root: str,
    recipe: dict[str, Any],
    fingerprint: str,
    source_digest: str,
    identities: dict[str, str],
) -> dict[str, Any]:
    paths = ArtifactPaths(version, experiment.retention.temporary_storage_ttl_days)
    iris = experiment.execution.iris
    topology = experiment.topology
    attempts = join(experiment_root, paths.attempts)
    checkpoints = join(experiment_root, paths.checkpoints)
    data_root = join(experiment_root, paths.staged_data)
    return {
        "schema_version": SCHEMA_VERSION,
        "run": {
            "id": f"{experiment.name}-{version}",
            "name": experiment.name,
            "version": version,
            "seed": experiment.seed,
            "mode": "train",
            "fingerprint": fingerprint,
            "export_hf": True,
        },
        "runtime": {
            "entrypoint": experiment.runtime.entrypoint,
            "strategy": experiment.runtime.strategy,
            "source_digest": source_digest,
        },
        "iris": {
            "cluster": iris.cluster if iris else None,
            "allocation": {
                "num_nodes": topology.num_nodes,
                "gpus_per_node": topology.gpus_per_node,
                "gpu_variant": topology.gpu_variant,
                "cpu": iris.cpu if iris else None,
                "memory": iris.memory if iris else None,
                "disk": iris.disk if iris else None,
            },
            "priority": iris.priority if iris else None,
            "max_retries": iris.max_retries if iris else None,
            "job_name": job_name(experiment.name, version, "train"),
        },
        "ingress": {"mode": "direct", "vllm_http_port": 8000},
        "ray": {
            "address": None,
            "port": 6379,
            "rendezvous_dir": f"{attempts}/rendezvous",
            "rendezvous_timeout_s": 1800,
            "cluster_join_timeout_s": 1800,
        },
        "artifacts": {
            "experiment_root": experiment_root,
            "checkpoint_root": checkpoints,
            "attempts_root": attempts,
            "export_root": join(experiment_root, paths.export),
            "terminal_manifest_uri": join(experiment_root, paths.terminal),
            "metrics_uri": f"{checkpoints}/metrics.jsonl",
            "resume_checkpoint_count": experiment.retention.resume_checkpoint_count,
            "temporary_storage_ttl_days": experiment.retention.temporary_storage_ttl_days,
        },
        "inputs": {
            "model": {
                "uri": join(experiment_root, paths.staged_model),
                "identity": identities["stage_model"],
                "tokenizer_uri": join(experiment_root, paths.staged_model),
                "tokenizer_revision": experiment.model.tokenizer.revision,
                "local_path": None,
            },
            "train_data": [
                {"uri": f"{data_root}/train/{i}.jsonl", "identity": identities["stage_data"], "kind": "jsonl"}
                for i, _ in enumerate(experiment.data.train)
            ],
            "validation_data": [
                {"uri": f"{data_root}/validation/{i}.jsonl", "identity": identities["stage_data"], "kind": "jsonl"}
                for i, _ in enumerate(experiment.data.validation)
            ],
        },
        "trainer": recipe,
    }


def dump_launch(document: dict[str, Any]) -> str:
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=120)
