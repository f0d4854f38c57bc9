"""Resolve an experiment version into its plan, running every deterministic check first.

Everything here is pure and fast: no network, no torch, no ray. It runs while Snakemake builds the DAG
(so a dry run fails before any job starts) and behind `rlbuild check`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbuild.errors import PreflightError, Violation
from rlbuild.identity import make_record, runtime_source_digest
from rlbuild.launch import build_launch
from rlbuild.recipe import compose_recipe
from rlbuild.roleplan import Geometry, check_role_plan, geometry
from rlbuild.spec import Experiment, check_version, load_experiment
from rlbuild.storage import ArtifactPaths, join

ARTIFACT_SOURCE = "artifact:base_model"
DERIVED_KINDS = ("train", "export", "eval")


@dataclass(frozen=True)
class Plan:
    """One experiment version, resolved: what will be built, where, and from what."""

    experiment: Experiment
    version: str
    experiment_root: str
    geometry: Geometry
    recipe: dict[str, Any]
    records: dict[str, dict[str, Any]]
    launch: dict[str, Any]

    @property
    def paths(self) -> ArtifactPaths:
        return ArtifactPaths(self.version, self.experiment.retention.temporary_storage_ttl_days)

    @property
    def uses_base_model(self) -> bool:
        return ARTIFACT_SOURCE in (self.experiment.model.source, self.experiment.model.tokenizer.source)


def check_sources(experiment: Experiment) -> list[Violation]:
    from rlbuild.staging import parse_source

    entries = [
        ("model", experiment.model.source, experiment.model.revision),
        ("model.tokenizer", experiment.model.tokenizer.source, experiment.model.tokenizer.revision),
    ]
    entries += [(f"data.train.{i}", d.source, d.revision) for i, d in enumerate(experiment.data.train)]
    entries += [(f"data.validation.{i}", d.source, d.revision) for i, d in enumerate(experiment.data.validation)]
    out: list[Violation] = []
    for field, source, revision in entries:
        try:
            problems = parse_source(source, revision).check()
        except ValueError as exc:
            problems = [str(exc)]
        out += [Violation(f"{field}.source", problem) for problem in problems]
    return out


def check_credentials(recipe: dict[str, Any]) -> list[Violation]:
    """Credentials a stage will need, checked where they are forwarded from: the submitting environment."""
    if recipe.get("trainer", {}).get("logger") != "wandb":
        return []
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE") in ("offline", "disabled"):
        return []
    return [
        Violation(
            "recipe.trainer.logger",
            "'wandb' needs WANDB_API_KEY in the submitting environment (it is forwarded to the jobs), and none is set",
            "export WANDB_API_KEY, or set WANDB_MODE=offline, or use logger: console",
        )
    ]


def check_model_shape(model_config: dict[str, Any], experiment: Experiment) -> list[Violation]:
    """Engine geometry against the model's own config (its config.json), once the model is known."""
    tp = experiment.role_plan.inference_engine_tensor_parallel_size
    out: list[Violation] = []
    for key in ("num_attention_heads", "num_key_value_heads"):
        heads = model_config.get(key)
        if isinstance(heads, int) and heads % tp and not (key == "num_key_value_heads" and tp % heads == 0):
            out.append(
                Violation(
                    "role_plan.inference_engine_tensor_parallel_size",
                    f"TP={tp} does not divide the model's {key}={heads}, so vLLM cannot shard it",
                    f"choose TP among the divisors of {heads}",
                )
            )
    return out


def check_experiment(experiment: Experiment) -> tuple[dict[str, Any], list[Violation]]:
    """All version-independent checks; returns the composed recipe and every violation."""
    violations = check_role_plan(experiment.topology, experiment.role_plan, experiment.runtime)
    recipe, recipe_violations = compose_recipe(experiment)
    violations += recipe_violations
    violations += check_sources(experiment)
    violations += check_credentials(recipe)
    return recipe, violations


def _records(experiment: Experiment, version: str, recipe: dict[str, Any], digest: str) -> dict[str, dict[str, Any]]:
    name = experiment.name
    records: dict[str, dict[str, Any]] = {}
    model_deps: dict[str, str] = {}
    if ARTIFACT_SOURCE in (experiment.model.source, experiment.model.tokenizer.source):
        records["base_model"] = make_record(
            experiment=name,
            kind="base_model",
            version=version,
            fields={"revision": experiment.model.revision, "seed": experiment.seed, "runtime_source_digest": digest},
        )
        model_deps["base_model"] = records["base_model"]["identity"]
    records["stage_model"] = make_record(
        experiment=name,
        kind="stage_model",
        version=version,
        fields={"model": experiment.model.model_dump(), "deps": model_deps},
        deps=model_deps,
    )
    records["stage_data"] = make_record(
        experiment=name, kind="stage_data", version=version, fields={"data": experiment.data.model_dump()}
    )
    launch_deps = {k: records[k]["identity"] for k in ("stage_model", "stage_data")}
    launch_fields = {
        "name": name,
        "version": version,
        "runtime": {**experiment.runtime.model_dump(), "source_digest": digest},
        "seed": experiment.seed,
        "topology": experiment.topology.model_dump(),
        "role_plan": experiment.role_plan.model_dump(),
        "retention": experiment.retention.model_dump(),
        "recipe": recipe,
        "deps": launch_deps,
    }
    records["launch"] = make_record(
        experiment=name, kind="launch", version=version, fields=launch_fields, deps=launch_deps
    )
    for kind in DERIVED_KINDS:
        records[kind] = make_record(
            experiment=name,
            kind=kind,
            version=version,
            fields=launch_fields,
            deps={"launch": records["launch"]["identity"]},
        )
    return records


def resolve(experiment: Experiment, version: str, storage_root: str, source: str = "experiment") -> Plan:
    """Resolve one version of an experiment; raise PreflightError with every violation found."""
    recipe, violations = check_experiment(experiment)
    violations = check_version(version) + violations
    if violations:
        raise PreflightError(source, violations)
    digest = runtime_source_digest()
    records = _records(experiment, version, recipe, digest)
    experiment_root = join(storage_root, experiment.name)
    launch = build_launch(
        experiment,
        version,
        experiment_root=experiment_root,
        recipe=recipe,
        fingerprint=records["launch"]["fingerprint"],
        source_digest=digest,
        identities={k: r["identity"] for k, r in records.items()},
    )
    return Plan(
        experiment=experiment,
        version=version,
        experiment_root=experiment_root,
        geometry=geometry(experiment.topology, experiment.role_plan),
        recipe=recipe,
        records=records,
        launch=launch,
    )


def resolve_file(path: Path, version: str, storage_root: str) -> Plan:
    return resolve(load_experiment(path), version, storage_root, source=str(path))
