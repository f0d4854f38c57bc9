"""Resolve one version of an experiment into its plan: the checked recipe, the identity records of every
artifact, and the launch document. Pure and fast: it runs for every version Snakemake considers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlbuild.contracts import runtime
from rlbuild.contracts.artifacts import METRICS_NAME, TemporaryPaths, artifact, experiment_root
from rlbuild.contracts.launch import (
    SCHEMA_VERSION,
    Allocation,
    Artifacts,
    Ingress,
    Input,
    Inputs,
    LaunchDocument,
    Ray,
    Run,
    Runtime,
)
from rlbuild.contracts.recipe import SANDBOX_PROVIDERS, Recipe
from rlbuild.contracts.sources import FOLDER_SCHEMES, parse_source
from rlbuild.core.errors import MissingCredential, PreflightError
from rlbuild.core.storage import join
from rlbuild.core.wire import numeric_env
from rlbuild.plan import environments, scheduling, series
from rlbuild.plan.identity import derived_record, make_record
from rlbuild.plan.modelcheck import BASE_MODEL_SOURCE, base_model_revision
from rlbuild.plan.noderuntime import NodeRuntime, node_runtime
from rlbuild.plan.preflight import load_experiment
from rlbuild.plan.roleplan import Geometry, geometry
from rlbuild.plan.spec import Experiment
from rlbuild.stages.staging import local_content_digest

# The tiny base model stands for a pretrained one: its revision names its weights, whatever seed the RL run (or an
# arm of a series) uses, so a seed sweep trains one model. Built with this seed (the default experiment's).
BASE_MODEL_SEED = 42


@dataclass(frozen=True)
class Plan:
    """One experiment version, resolved: what will be built, where, and from what."""

    experiment: Experiment
    version: str
    experiment_root: str
    geometry: Geometry
    recipe: Recipe
    records: dict[str, dict[str, Any]]
    launch: LaunchDocument
    nodes: NodeRuntime  # what the job's nodes run (this .venv, uv.lock + extra, or an image)
    # The version key each shared stage is built under (an arm's stages may be an earlier arm's; plan/series.py).
    stage_keys: Mapping[str, str] = field(default_factory=dict)

    def key_of(self, kind: str) -> str:
        """The version key under which `kind`'s artifact of this plan lives."""
        return self.stage_keys.get(kind, self.version)

    @property
    def temporary(self) -> TemporaryPaths:
        return temporary_paths(self.experiment, self.version, self.records["train"]["fingerprint"])

    @property
    def uses_base_model(self) -> bool:
        return BASE_MODEL_SOURCE in (self.experiment.model.source, self.experiment.model.tokenizer.source)

    def uri(self, relative: str) -> str:
        return join(self.experiment_root, relative)


def temporary_paths(experiment: Experiment, version: str, train_fingerprint: str) -> TemporaryPaths:
    return TemporaryPaths(version, experiment.retention.temporary_storage_ttl_days, train_fingerprint)


def local_contents(sources: dict[str, tuple[str, str]]) -> dict[str, dict[str, str]]:
    """`{"content": {name: digest}}` for the `local:` and `harbor:` sources among `sources`: their revision is a label,
    so what the folder holds now is part of the identity (editing a local model folder changes it)."""
    digests = {
        name: local_content_digest(parsed)
        for name, (source, revision) in sources.items()
        if (parsed := parse_source(source, revision)).scheme in FOLDER_SCHEMES
    }
    return {"content": digests} if digests else {}


def build_records(
    experiment: Experiment, version: str, recipe: Recipe, digest: str, stage_keys: Mapping[str, str] | None = None
) -> dict[str, dict[str, Any]]:
    """Every artifact's identity record, in build order; each names the identities it depends on. `stage_keys`:
    the version key each shared stage is built under (default: `version`)."""
    name = experiment.name
    stage = {kind: (stage_keys or {}).get(kind, version) for kind in series.SHARED_STAGES}
    records: dict[str, dict[str, Any]] = {}
    model_deps: dict[str, str] = {}
    revision = base_model_revision(experiment)
    if revision is not None:
        # The revision label names the variant built (rlbuild/contracts/tinymodel.py): a field of its own would
        # only repeat it, and change every completed version's record.
        fields = {"revision": revision, "seed": BASE_MODEL_SEED, "runtime_source_digest": digest}
        records["base_model"] = make_record(
            experiment=name, kind="base_model", version=stage["base_model"], fields=fields
        )
        model_deps["base_model"] = records["base_model"]["identity"]
    model = experiment.model
    model_content = local_contents(
        {"model": (model.source, model.revision), "tokenizer": (model.tokenizer.source, model.tokenizer.revision)}
    )
    records["stage_model"] = make_record(
        experiment=name,
        kind="stage_model",
        version=stage["stage_model"],
        fields={"model": model.model_dump(), "deps": model_deps, **model_content},
        deps=model_deps,
    )
    data = {
        f"{split}.{i}": (d.source, d.revision)
        for split in ("train", "validation")
        for i, d in enumerate(getattr(experiment.data, split))
    }
    # Environments from other packages than rlbuild carry their own version into what they generate and score.
    task_providers = environments.providers(list(environments.task_sources(experiment).values()))
    records["stage_data"] = make_record(
        experiment=name,
        kind="stage_data",
        version=stage["stage_data"],
        fields={
            "data": experiment.data.model_dump(),
            **local_contents(data),
            **({"environments": task_providers} if task_providers else {}),
        },
    )
    launch_deps = {k: records[k]["identity"] for k in ("stage_model", "stage_data")}
    records["launch"] = make_record(
        experiment=name,
        kind="launch",
        version=version,
        fields=_launch_fields(experiment, version, recipe, digest, launch_deps),
        deps=launch_deps,
    )
    for kind in ("train", "export", "eval"):
        records[kind] = derived_record(records["launch"], kind)
    return records


def _launch_fields(
    experiment: Experiment, version: str, recipe: Recipe, digest: str, deps: dict[str, str]
) -> dict[str, Any]:
    """The identity-bearing fields of the launch record: what the training computes from, and with which code."""
    launch_fields = {
        "name": experiment.name,
        "version": version,
        # No `image: null` for an experiment without one: the launch identities of versions built before the
        # field existed stay what they were.
        "runtime": {**experiment.runtime.model_dump(exclude_none=True), "source_digest": digest},
        "seed": experiment.seed,
        # Without `node_platform: null`: the identities of versions built before the field existed stay the same.
        "topology": experiment.topology.model_dump(exclude_none=True),
        "role_plan": experiment.role_plan.model_dump(),
        "retention": experiment.retention.model_dump(),
        "recipe": recipe.model_dump(mode="json"),
        "deps": deps,
    }
    env_provider = environments.providers([recipe.environment.env_class])
    if env_provider:
        launch_fields["environments"] = env_provider
    numeric = numeric_env(experiment.execution.env)
    if numeric:  # only these job variables change what training computes; the rest are placement
        launch_fields["env"] = numeric
    return launch_fields


def build_launch(
    experiment: Experiment, version: str, root: str, recipe: Recipe, records: dict[str, dict[str, Any]], digest: str
) -> LaunchDocument:
    """The launch document of a resolved version (rlbuild/contracts/launch.py says what each section means)."""
    temporary = temporary_paths(experiment, version, records["train"]["fingerprint"])
    data_root = join(root, artifact("stage_data").version_folder(records["stage_data"]["version"]))
    data_identity = records["stage_data"]["identity"]
    return LaunchDocument(
        schema_version=SCHEMA_VERSION,
        run=Run(
            # One W&B run per configuration: a `dev` version trains many, and an arm is a run of its own.
            id=f"{experiment.name}-{version.replace('@', '-')}-{records['launch']['fingerprint'][:8]}",
            name=experiment.name,
            version=version,
            seed=experiment.seed,
            fingerprint=records["launch"]["fingerprint"],
        ),
        runtime=Runtime(
            entrypoint=experiment.runtime.entrypoint,
            strategy=experiment.runtime.strategy,
            source_digest=digest,
            image=experiment.runtime.image,
            image_provides=experiment.runtime.image_provides,
        ),
        allocation=Allocation(**experiment.topology.model_dump(include=set(Allocation.model_fields))),
        schedulers=scheduling.launch_settings(experiment),
        ingress=Ingress(mode="ray_actors"),
        ray=Ray(address=None, rendezvous_dir=join(root, temporary.attempts, "rendezvous")),
        artifacts=Artifacts(
            checkpoint_root=join(root, temporary.checkpoints),
            attempts_root=join(root, temporary.attempts),
            export_root=join(root, artifact("export").path(version)),
            terminal_manifest_uri=join(root, artifact("train").path(version)),
            metrics_uri=join(root, artifact("train").file(version, METRICS_NAME)),
            metrics_segments_root=join(root, temporary.metrics),
            trajectories_root=join(root, temporary.trajectories),
            resume_checkpoint_count=experiment.retention.resume_checkpoint_count,
        ),
        inputs=Inputs(
            model=Input(
                uri=join(root, artifact("stage_model").path(records["stage_model"]["version"])),
                identity=records["stage_model"]["identity"],
            ),
            train_data=[
                Input(uri=f"{data_root}/train/{i}.jsonl", identity=data_identity)
                for i, _ in enumerate(experiment.data.train)
            ],
            validation_data=[
                Input(uri=f"{data_root}/validation/{i}.jsonl", identity=data_identity)
                for i, _ in enumerate(experiment.data.validation)
            ],
        ),
        recipe=recipe,
        env=dict(sorted(experiment.execution.env.items())),
        credentials=list(SANDBOX_PROVIDERS[recipe.environment.sandbox.backend].credentials)
        if recipe.environment.sandbox is not None
        else [],
    )


def resolve(
    experiment: Experiment,
    version: str,
    storage_root: str,
    source: str = "experiment",
    *,
    shares_venv: bool = True,
    starts_jobs: bool = True,
) -> Plan:
    """Check an experiment (series.check) and resolve one version key of it: for a caller that plans one version.
    One that plans several checks once and resolves each with `resolve_checked`."""
    checked = series.check(experiment, shares_venv=shares_venv)
    return resolve_checked(checked, version, storage_root, source, starts_jobs=starts_jobs)


def resolve_checked(
    checked: series.CheckedExperiment,
    version: str,
    storage_root: str,
    source: str = "experiment",
    *,
    starts_jobs: bool = True,
) -> Plan:
    """Resolve one version key of a checked experiment (a version, or `<version>@<arm>` of a series); raise
    PreflightError with every violation found. `starts_jobs=False` (a reader of storage, such as `rlbuild
    status`): the credentials only jobs use are not asked for."""
    own = series.checked_of(checked, version)
    experiment, recipe, violations = own.experiment, own.recipe, list(own.violations)
    if not starts_jobs:
        violations = [v for v in violations if not isinstance(v, MissingCredential)]
    violations = series.key_problems(checked, version) + violations
    if violations or recipe is None:
        raise PreflightError(source, violations)
    digest = runtime.source_digest()
    root = experiment_root(storage_root, experiment.name)
    stage_keys = series.stage_keys(checked, version)
    records = build_records(experiment, version, recipe, digest, stage_keys)
    return Plan(
        experiment=experiment,
        version=version,
        experiment_root=root,
        geometry=geometry(experiment.topology, experiment.role_plan),
        recipe=recipe,
        records=records,
        launch=build_launch(experiment, version, root, recipe, records, digest),
        nodes=node_runtime(experiment, shares_venv=checked.shares_venv),
        stage_keys=stage_keys,
    )


def resolve_file(path: Path, version: str, storage_root: str) -> Plan:
    return resolve(load_experiment(path), version, storage_root, source=str(path))
