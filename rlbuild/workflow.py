"""What the Snakefile needs from the library: the experiment, its checked plans, and storage locations.

Kept free of heavy imports (no torch, no ray): it runs on every `snakemake` invocation, dry runs included.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlbuild import slurm
from rlbuild.artifacts import ARTIFACTS, MUTABLE_VERSION, artifact, kind_of_target
from rlbuild.errors import PreflightError, RlbuildError, Violation
from rlbuild.identity import check_drift
from rlbuild.jobenv import restrict_to_forwarded
from rlbuild.plan import Plan, resolve
from rlbuild.planview import format_plan
from rlbuild.preflight import check_experiment, check_model_shape
from rlbuild.redact import redact_text
from rlbuild.spec import Experiment, check_version, load_experiment
from rlbuild.storage import join, read_json, read_text


def fail(error: RlbuildError) -> None:
    """Report a deterministic configuration error and stop Snakemake before it builds anything."""
    print(redact_text(str(error)), file=sys.stderr)
    raise SystemExit(2)


def scope_storage(workflow: Any, local_root: Path, experiment: str) -> str:
    """Point Snakemake at the experiment root; return the storage root above it.

    Local storage: the experiment root becomes the working directory (the Snakefile's `workdir:`).
    A default storage provider (S3 under a profile): the experiment name is appended to the default storage
    prefix, once; spawned jobs receive the scoped prefix and leave it alone.
    """
    settings = workflow.storage_settings
    if not settings.default_storage_provider:
        return str(local_root.resolve())
    _export_s3_settings(workflow)
    recheck_missing_directories()
    prefix = settings.default_storage_prefix.rstrip("/")
    if prefix.endswith(f"/{experiment}"):
        return prefix[: -len(experiment) - 1]
    settings.default_storage_prefix = f"{prefix}/{experiment}"
    return prefix


def recheck_missing_directories() -> None:
    """snakemake-storage-plugin-s3 0.3.6 caches `is_dir() == False` from the DAG-time probe of a directory output
    that does not exist yet, so the main process never sees the directory a cluster job uploads (`export/v...`
    "missing in storage" after --latency-wait). Keep only a found directory cached. The Iris executor forgets the
    probe itself on success; the official Slurm plugin has no such hook."""
    from snakemake_storage_plugin_s3 import StorageObject

    probe = StorageObject.is_dir
    if getattr(probe, "rechecks_misses", False):
        return

    def is_dir(self: StorageObject) -> bool:
        found = probe(self)
        if not found:
            self._is_dir = None
        return found

    is_dir.rechecks_misses = True  # type: ignore[attr-defined]
    StorageObject.is_dir = is_dir  # type: ignore[method-assign]


S3_SETTINGS_ENV = {
    "endpoint_url": "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL",
    "region": "SNAKEMAKE_STORAGE_S3_REGION",
    "access_key": "SNAKEMAKE_STORAGE_S3_ACCESS_KEY",
    "secret_key": "SNAKEMAKE_STORAGE_S3_SECRET_KEY",
    "token": "SNAKEMAKE_STORAGE_S3_TOKEN",
}


def _export_s3_settings(workflow: Any) -> None:
    """Let rlbuild's own storage reads (identity records at DAG time) reach the store Snakemake uses,
    also when the S3 settings came from a profile rather than the environment."""
    tagged = (workflow.storage_provider_settings or {}).get("s3")
    settings = tagged.get_settings() if tagged is not None else None
    for name, variable in S3_SETTINGS_ENV.items():
        value = getattr(settings, name, None)
        if value and not os.environ.get(variable):
            os.environ[variable] = str(value)


def experiment_file(repo: Path, selector: str) -> Path:
    """`experiment: <name>` selects config/experiments/<name>.yaml; a path to a .yaml file is used as given."""
    if selector.endswith((".yaml", ".yml")):
        return Path(selector).resolve()
    return repo / "config" / "experiments" / f"{selector}.yaml"


@dataclass
class Graph:
    """One experiment's artifact graph as Snakemake sees it."""

    experiment_file: Path
    announce: bool
    on_cluster: bool = False  # a cluster executor (remote jobs: Snakemake's --jobs), not the local one
    storage_root: str = ""
    workflow: Any = None
    experiment: Experiment = field(init=False)
    _plans: dict[str, Plan] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.experiment = load_experiment(self.experiment_file)
        _, violations = check_experiment(self.experiment)
        if self.announce and self.on_cluster:  # jobs re-read the Snakefile after the submitter checked everything
            violations += slurm.partition_problems(self.experiment)  # asked only where Slurm answers (sinfo)
        if violations:
            raise PreflightError(str(self.experiment_file), violations)

    def bind_storage(self, workflow: Any, local_root: Path) -> None:
        self.workflow = workflow
        self.storage_root = scope_storage(workflow, local_root, self.experiment.name)

    def terminal_stage(self, version: str) -> str:
        """The last artifact kind this invocation asks for, as the plan reports it."""
        settings = getattr(self.workflow, "dag_settings", None)
        targets = [str(t) for t in (settings.targets if settings else ())]
        if not targets or "all" in targets:
            return ARTIFACTS[-1].kind
        asked = {kind_of_target(t) for t in targets if f"/v{version}" in t}
        return next((a.kind for a in reversed(ARTIFACTS) if a.kind in asked), ARTIFACTS[-1].kind)

    @property
    def experiment_root(self) -> str:
        return join(self.storage_root, self.experiment.name)

    def plan(self, version: str) -> Plan:
        """The checked plan of one version; stops on any violation or identity drift."""
        if version not in self._plans:
            problems: list[Violation] = check_version(version)
            if problems:
                raise PreflightError(str(self.experiment_file), problems)
            plan = resolve(self.experiment, version, self.storage_root, source=str(self.experiment_file))
            check_drift(version, plan.records, lambda kind: read_json(plan.uri(artifact(kind).record(version))))
            step_time = self._measured_step_time(plan)
            staged_model = artifact("stage_model").path(version)
            model_config = read_json(plan.uri(f"{staged_model}/config.json"))
            problems = check_model_shape(model_config or {}, self.experiment)
            if problems:
                raise PreflightError(f"{self.experiment_file} (staged model {staged_model})", problems)
            self._plans[version] = plan
            if self.announce:
                print(format_plan(plan, self.terminal_stage(version), step_time), file=sys.stderr)
        return self._plans[version]

    def _measured_step_time(self, plan: Plan) -> float | None:
        """Seconds per step measured by an earlier run of this version (a previous link, a crashed attempt), when
        the experiment states none; a chain that would not fit its links stops here."""
        placement = self.experiment.execution.slurm
        if placement is None or placement.step_time_s is not None or not self.announce:
            return None  # in a job (a later link reads the earlier links' metrics), the submitter has checked
        measured = slurm.measured_step_time(read_text(plan.launch.artifacts.metrics_uri))
        t = plan.recipe.trainer
        problems = slurm.check_chain(self.experiment, t.max_steps, t.ckpt_interval, measured)
        if problems:
            raise PreflightError(f"{self.experiment_file} (step time measured in an earlier run)", problems)
        return measured

    def checked(self, version: str) -> Plan:
        """`plan`, with errors reported for a person and Snakemake stopped (input functions call this)."""
        try:
            return self.plan(version)
        except RlbuildError as error:
            fail(error)
            raise  # unreachable: fail() exits

    def marker(self, kind: str) -> Callable[[Any], list[str]]:
        """Input function: checks the version's plan; for `dev`, depends on the artifact's current fingerprint."""

        def inputs(wildcards: Any) -> list[str]:
            plan = self.checked(wildcards.version)
            if wildcards.version != MUTABLE_VERSION:
                return []
            return [f".fingerprints/{kind}/v{wildcards.version}/{plan.records[kind]['fingerprint']}"]

        return inputs

    def stage_model_inputs(self, wildcards: Any) -> dict[str, Any]:
        plan = self.checked(wildcards.version)
        inputs: dict[str, Any] = {"marker": self.marker("stage_model")(wildcards)}
        if plan.uses_base_model:
            inputs["base_model"] = artifact("base_model").path(wildcards.version)
        return inputs

    def on_start(self, workflow: Any) -> None:
        """Before the first submission (the Snakefile's `onstart`): under Slurm, whose plugin submits with
        `sbatch --export=ALL`, cut this process's environment to what jobs may receive."""
        plugin = getattr(workflow, "executor_plugin", None)
        if plugin is None or plugin.name != "slurm":
            return
        removed = restrict_to_forwarded(os.environ)
        if removed:
            print(f"rlbuild: not passed to Slurm jobs: {', '.join(removed)}", file=sys.stderr)

    def cluster_resources(self) -> dict[str, int | str]:
        """Resources of the rules that run on a cluster besides train (Slurm account, partition, QoS)."""
        return slurm.cluster_resources(self.experiment)

    def gang_resources(self) -> dict[str, int | str]:
        """Resources the Iris and Slurm executors read to run `train` as one gang of whole nodes."""
        topology, iris = self.experiment.topology, self.experiment.execution.iris
        resources: dict[str, int | str] = {
            "gpu_nodes": topology.num_nodes,
            "gpus_per_node": topology.gpus_per_node,
            "gpu_variant": topology.gpu_variant,
        }
        if iris is not None:
            resources |= {
                "iris_cpu": int(iris.cpu),
                "iris_memory": iris.memory,
                "iris_disk": iris.disk,
                "iris_priority": iris.priority,
                "iris_max_retries": iris.max_retries,
            }
        return resources | slurm.gang_resources(self.experiment)
