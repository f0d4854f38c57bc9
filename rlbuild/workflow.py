"""What the Snakefile needs from the library: its validated config, the experiment, each version's checked plan,
storage scoping, and the guard that keeps Snakemake from retraining a completed fixed version.

Kept free of heavy imports (no torch, no ray): it runs on every `snakemake` invocation, dry runs included.
"""

from __future__ import annotations

import atexit
import difflib
import os
import re
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from snakemake.common import dict_to_key_value_args
from snakemake.io import ancient
from snakemake_interface_executor_plugins.settings import SharedFSUsage
from snakemake_interface_storage_plugins.io import WILDCARD_REGEX

from rlbuild.contracts import checkpoints
from rlbuild.contracts.artifacts import (
    ARTIFACTS,
    arm_key,
    arm_of,
    artifact,
    experiment_root,
    is_mutable,
    key_of_target,
    kind_of_target,
    terminal_stage,
    version_of,
)
from rlbuild.contracts.recipe import HARBOR_EXTRA
from rlbuild.core import storage
from rlbuild.core.errors import PreflightError, RetrainRefusedError, RlbuildError, Violation
from rlbuild.core.inventory import Inventory
from rlbuild.core.redact import redact_text
from rlbuild.core.storage import LEASE_RUN_ENV, check_lease
from rlbuild.core.validation import violations
from rlbuild.core.wire import INTERRUPTED_EXIT_CODE, restrict_to_forwarded
from rlbuild.core.yamlfile import load_yaml
from rlbuild.job import interrupts
from rlbuild.ops.lease import Leases, arm_jobs, describe, held_leases, lease_of, lease_uri
from rlbuild.plan import scheduling, series
from rlbuild.plan.noderuntime import GPU_EXTRA, node_runtime
from rlbuild.plan.planview import format_plan
from rlbuild.plan.preflight import load_experiment
from rlbuild.plan.resolve import Plan
from rlbuild.plan.series import CheckedExperiment
from rlbuild.plan.spec import Experiment, NodeLimits, check_version, node_size
from rlbuild.plan.versioning import (
    StoredRecords,
    checked_plan,
    experiment_problems,
    measured_step_time,
    plan_cost,
    read_ahead,
    rebuild_reasons,
)
from rlbuild.schedulers.base import COMMAND_RESOURCES, JobRequest
from rlbuild.schedulers.registry import SCHEDULERS, bundle_settings, cluster_names, executor_scheduler, resource_owner

RULE_KIND = {a.rule: a.kind for a in ARTIFACTS}
# Rules whose rerun makes `train` rerun: train itself and everything upstream of it.
TRAIN_AND_UPSTREAM = {a.rule for a in ARTIFACTS[: [a.kind for a in ARTIFACTS].index("train") + 1]}


class WorkflowConfig(BaseModel):
    """`config/config.yaml` and `--config key=value`: what this checkout builds and where."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    experiment: str = Field(min_length=1, description="config/experiments/<name>.yaml, or a path to a .yaml file")
    versions: list[str] = Field(min_length=1, description="the versions `snakemake` builds with no target")
    storage_root: str = Field(min_length=1, description="the local storage root, relative to the repository")
    allow_retrain: bool = Field(False, description="let this run retrain a completed fixed version")
    skip_smoke: bool = Field(False, description="let a series' arms train without waiting for its smoke arm")
    # The largest node the cluster offers, declared by a profile (`config: [node_memory=2TB, ...]`) or here: the
    # experiment's per-node sizes must fit it. Undeclared: unchecked.
    node_cpu: float | None = Field(None, gt=0, description="CPUs of the largest node")
    node_memory: str | None = Field(None, description="memory of the largest node, e.g. 2TB")
    node_disk: str | None = Field(None, description="disk of the largest node, e.g. 8TB")

    @field_validator("node_memory", "node_disk")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        return None if value is None else node_size(value)

    @property
    def node_limits(self) -> NodeLimits:
        return NodeLimits(self.node_cpu, self.node_memory, self.node_disk)

    @field_validator("versions", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


def workflow_config(config: dict[str, Any], source: str = "--config / config/config.yaml") -> WorkflowConfig:
    """The validated workflow config; every problem at once, naming the key and the fix."""
    try:
        parsed = WorkflowConfig.model_validate(config)
    except ValidationError as exc:
        raise PreflightError(source, violations(exc, config, WorkflowConfig, "config.")) from None
    problems = [
        v.__class__(f"config.versions[{i}]", v.message, v.fix)
        for i, version in enumerate(parsed.versions)
        for v in check_version(version)
    ]
    if "://" in parsed.storage_root:  # joined to the repository it would become a local folder named `s3:`
        problems.append(
            Violation(
                "config.storage_root",
                f"{parsed.storage_root!r} is a URL; this key is the local folder (relative to the repository)",
                f"for S3 run `snakemake --profile {cluster_names()}` with RLBUILD_BUCKET and RLBUILD_PREFIX exported",
            )
        )
    if problems:
        raise PreflightError(source, problems)
    return parsed


def rule_param[P: (str, list[str])](value: P) -> P | Callable[[Any], P]:
    """A rule param that reaches the command as given. Snakemake formats the strings of a param with the job's
    wildcards: a value holding `{name}` (a path may) is handed over as a function, whose result it leaves alone;
    any other value as itself, since Snakemake calls every param function of every job (0.3 ms a call: 0.1 s of a
    50-version dry run)."""
    strings = [value] if isinstance(value, str) else value
    if any(WILDCARD_REGEX.search(s) for s in strings):
        return lambda wildcards: value
    return value


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
        return storage.storage_root(str(local_root), "config.storage_root")
    _export_s3_settings(workflow)
    prefix = (settings.default_storage_prefix or "").rstrip("/")
    unset = set(re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", prefix))
    if prefix.startswith("s3://") and not prefix.removeprefix("s3://").split("/")[0]:
        unset.add("RLBUILD_BUCKET")  # set, but empty: the profile's bucket comes from it
    unset = sorted(unset)
    if unset or not prefix:
        raise StorageSettingsError(
            f"the default storage prefix {prefix or '(none)'!r} needs {', '.join(unset) or 'a value'}: export "
            f"{' '.join(f'{name}=...' for name in unset) or 'RLBUILD_BUCKET=... RLBUILD_PREFIX=...'} (artifacts go "
            "to s3://$RLBUILD_BUCKET/$RLBUILD_PREFIX/<experiment>/), and SNAKEMAKE_STORAGE_S3_ENDPOINT_URL, "
            "SNAKEMAKE_STORAGE_S3_ACCESS_KEY, SNAKEMAKE_STORAGE_S3_SECRET_KEY unless boto's own chain has them"
        )
    bucket = prefix.removeprefix("s3://").split("/")[0]
    if prefix.startswith("s3://") and (problem := storage.bucket_problem(bucket)):
        raise StorageSettingsError(
            f"the default storage prefix {prefix!r} cannot be used: {problem}. Export RLBUILD_BUCKET and "
            "RLBUILD_PREFIX with real values (artifacts go to s3://$RLBUILD_BUCKET/$RLBUILD_PREFIX/<experiment>/)"
        )
    recheck_missing_directories()
    bound_plugin_requests(workflow.storage_registry.default_storage_provider)
    if prefix.endswith(f"/{experiment}"):
        return prefix[: -len(experiment) - 1]
    settings.default_storage_prefix = experiment_root(prefix, experiment)
    return prefix


def bound_plugin_requests(provider: Any) -> None:
    """snakemake-storage-plugin-s3 makes its client with botocore's default timeouts (60 s to connect, 60 s to
    read, per attempt): Snakemake's own uploads and probes of an endpoint that stopped answering block for
    minutes. Its client is made again with rlbuild's connect and read timeouts (`storage.request_timeouts`), its
    settings and `--storage-s3-retries` kept, so each of its requests ends within retries x (connect + read)."""
    import boto3
    from botocore.config import Config

    if getattr(provider, "requests_bounded", False) or not hasattr(provider, "s3c"):
        return
    s = provider.settings
    provider.s3c = boto3.resource(
        "s3",
        endpoint_url=s.endpoint_url,
        region_name=s.region,
        aws_access_key_id=s.access_key,
        aws_secret_access_key=s.secret_key,
        aws_session_token=s.token,
        config=provider.s3c.meta.client.meta.config.merge(Config(**storage.request_timeouts())),
    )
    provider.requests_bounded = True


def recheck_missing_directories() -> None:
    """snakemake-storage-plugin-s3 0.3.6 caches `is_dir() == False` from the DAG-time probe of a directory output
    that does not exist yet, so the main process never sees the directory a cluster job uploads (`export/v...`
    "missing in storage" after --latency-wait). Keep only a found directory cached (an executor plugin may forget
    the probe itself on success; not every one has such a hook)."""
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


class PlannedStateChangedError(RlbuildError):
    """Storage changed under an artifact between the plan and the build."""


_LISTED: list[Inventory] = []  # the inventory the S3 plugin's patched methods answer from (one experiment a process)
_PARENT_KEYS: dict[Any, str] = {}  # its root's IOCache key, by the provider's local prefix


def fence_uploads(experiment_root: str) -> None:
    """Snakemake's S3 plugin uploads a job's outputs after the job ends (from this process, or on a cluster from
    the job's own Snakemake): each upload of an artifact's object first checks that this run still holds that
    artifact's lease (rlbuild/ops/lease.py), so a run that lost it while frozen uploads nothing over the outputs
    of the run that took it over; the job fails with the new holder named."""
    from snakemake_storage_plugin_s3 import StorageObject

    own = getattr(StorageObject.store_object, "unfenced", StorageObject.store_object)

    def store_object(self: StorageObject) -> None:
        run = os.environ.get(LEASE_RUN_ENV)
        lease = lease_of(experiment_root, f"s3://{self.bucket}/{self.key}")
        if run and lease:
            check_lease(lease, run)
        own(self)

    store_object.unfenced = own  # type: ignore[attr-defined]
    StorageObject.store_object = store_object


def answer_from_listings(inventory: Inventory) -> None:
    """Snakemake asks the S3 plugin, object by object, whether every input and output exists and when it was
    written (about 3 requests each: HEAD, a bucket HEAD, a directory LIST); its own inventory lists only the
    first object's folder and then stops. Here the plugin's inventory of any object under the experiment root
    fills Snakemake's IOCache from the rlbuild inventory's listings (one per top-level folder, shared with the
    record reads): every object, every directory output (existing when it holds objects; mtime the newest,
    size the sum, as the plugin's own `is_dir`/`mtime`/`size` compute them), and the folders marked as
    inventoried, so what they do not hold is missing without a request. Objects elsewhere keep the plugin's
    own inventory. The IOCache serves only the DAG: Snakemake deactivates it before jobs run, so existence after
    a job (and `recheck_missing_directories`) still asks storage."""
    from snakemake_storage_plugin_s3 import StorageObject

    _LISTED[:] = [inventory]
    _PARENT_KEYS.clear()
    if getattr(StorageObject.inventory, "answers_from_listings", False):
        return
    own_inventory, own_parent = StorageObject.inventory, StorageObject.get_inventory_parent

    def folder_of(self: StorageObject) -> str | None:
        return _LISTED[0].top_folder(f"s3://{self.bucket}/{self.key}") if _LISTED else None

    def get_inventory_parent(self: StorageObject) -> str | None:
        # One parent for every object the listings answer for: the experiment root, all of it listed at once.
        # (Asked several times of every input and output of every job: made once.)
        if folder_of(self) is None:
            return own_parent(self)
        if (parent := _PARENT_KEYS.get(self.provider.local_prefix)) is None:
            parent = _PARENT_KEYS[self.provider.local_prefix] = self.cache_key(_LISTED[0].root.removeprefix("s3://"))
        return parent

    async def inventory(self: StorageObject, cache: Any) -> None:
        known = getattr(cache.exists_in_storage, "has_inventory", None)
        if folder_of(self) is None or known is None:
            return await own_inventory(self, cache)
        if self.get_inventory_parent() in known:
            return None
        for folder in _LISTED[0].top_folders():
            _fill(cache, self, folder, _LISTED[0].folder(folder.rsplit("/", 1)[-1]).values())
        known.add(self.get_inventory_parent())
        return None

    inventory.answers_from_listings = True  # type: ignore[attr-defined]
    StorageObject.inventory = inventory  # type: ignore[method-assign]
    StorageObject.get_inventory_parent = get_inventory_parent  # type: ignore[method-assign]


def _fill(cache: Any, anchor: Any, folder: str, objects: Any) -> None:
    """Snakemake's IOCache entries of every object listed under `folder` and of every directory they lie in."""
    from snakemake_interface_storage_plugins.io import Mtime

    directories: dict[str, list[Any]] = {}
    for found in objects:
        if found.uri.endswith("/"):
            continue  # a folder marker: the plugin's directories leave them out too
        key = anchor.cache_key(found.uri.removeprefix("s3://"))
        cache.exists_in_storage[key] = True
        cache.mtime[key] = Mtime(storage=found.mtime)
        cache.size[key] = found.size
        parts = found.uri[len(folder) + 1 :].split("/")
        for depth in range(len(parts)):
            directories.setdefault("/".join([folder, *parts[:depth]]), []).append(found)
    for directory, inside in directories.items():
        key = anchor.cache_key(directory.removeprefix("s3://"))
        cache.exists_in_storage[key] = True
        cache.mtime[key] = Mtime(storage=max(o.mtime for o in inside))
        cache.size[key] = sum(o.size for o in inside)


def clear_local_copies(jobs: Any) -> None:
    """`onstart:` remove the local copies (`.snakemake/storage/...`) of the storage outputs of every job about to
    run. Before a job reruns, Snakemake 9.27 removes its stored outputs but not their local copies, so after a kill
    during an upload the folder the job writes is already full ("output directory ... is not empty") and the
    half-uploaded one is taken for the output (`max() iterable argument is empty`). A job's outputs are rewritten
    by the job in any case; clearing them is what Snakemake does for local outputs."""
    for job in jobs:
        for output in job.output:
            if not getattr(output, "is_storage", False):
                continue
            local = Path(output.storage_object.local_path())
            if local.is_dir() and not local.is_symlink():
                shutil.rmtree(local)
            elif local.is_symlink() or local.exists():
                local.unlink()


S3_SETTINGS_ENV = {
    "endpoint_url": "SNAKEMAKE_STORAGE_S3_ENDPOINT_URL",
    "region": "SNAKEMAKE_STORAGE_S3_REGION",
    "access_key": "SNAKEMAKE_STORAGE_S3_ACCESS_KEY",
    "secret_key": "SNAKEMAKE_STORAGE_S3_SECRET_KEY",
    "token": "SNAKEMAKE_STORAGE_S3_TOKEN",
}


class StorageSettingsError(RlbuildError):
    """The storage the run would use is not configured."""


def report_with_results(workflow: Any, graph: Graph) -> None:
    """`--report report.html` lands where the user typed it, not in the experiment root the Snakefile's `workdir:`
    moves into (Snakemake resolves the report path only after that move); it opens on the results of the versions
    it reports (the report's global description), and the command ends saying them and where the report is
    (rlbuild/ops/results.py)."""
    create_report = workflow.create_report
    typed_in = Path(workflow.workdir_init)

    def create(report_plugin: Any, report_settings: Any, global_report_settings: Any) -> Any:
        import tempfile

        from snakemake.sourcecache import infer_source_file

        from rlbuild.ops.results import closing_lines, landing_text, read_outcome

        path = getattr(report_settings, "path", None)
        if path is not None and not Path(path).is_absolute():
            report_settings.path = typed_in / path
        name, root = graph.experiment.name, graph.experiment_root
        outcomes = [read_outcome(name, root, key) for key in graph.keys_asked()]
        with tempfile.TemporaryDirectory(prefix="rlbuild-report-") as tmp:
            landing = Path(tmp) / "results.rst"
            landing.write_text(landing_text(outcomes))
            workflow.report_text = infer_source_file(str(landing))
            made = create_report(report_plugin, report_settings, global_report_settings)
        # The rules' logs are relative to where the jobs ran: the experiment root, or here on remote storage.
        logs = {o.key: str(log.resolve()) for o in outcomes if (log := Path(f"logs/eval/v{o.key}.log")).is_file()}
        for line in closing_lines(outcomes, str(report_settings.path), logs):
            print(line, file=sys.stderr)
        return made

    workflow.create_report = create


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
    """`experiment: <name>` selects config/experiments/<name>.yaml; a path (to a .yaml file) is used as given."""
    if selector.endswith((".yaml", ".yml")) or "/" in selector or Path(selector).is_file():
        return Path(os.path.abspath(selector))  # links kept: a symlink loop is reported by load_yaml, not raised
    folder = repo / "config" / "experiments"
    path = folder / f"{selector}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in folder.glob("*.yaml"))
        close = difflib.get_close_matches(selector, known, n=1)
        fix = (f"did you mean '{close[0]}'? " if close else "") + f"known experiments: {', '.join(known)}"
        raise PreflightError("config.experiment", [Violation("experiment", f"{selector!r} names no file {path}", fix)])
    return path


def in_checkout(repo: Path, path: Path) -> str:
    """`path` relative to the checkout, as a job that runs the checkout's bundle finds it; refused when the bundle
    would not carry it (outside the checkout, git-ignored, or left out by a scheduler's bundle excludes)."""
    fix = (
        "jobs that get the checkout as a bundle see no other file of this machine: put the experiment in "
        "the checkout, e.g. config/experiments/ (not git-ignored)"
    )
    try:
        relative = path.resolve().relative_to(repo.resolve()).as_posix()
    except ValueError:
        problem = f"{path} is outside the checkout {repo}"
    else:
        if not _left_out_of_bundles(repo, relative):
            return relative
        problem = f"{relative} is git-ignored or excluded from bundles by pyproject.toml ({bundle_settings()})"
    raise PreflightError("config.experiment", [Violation("experiment", problem, fix)])


def _left_out_of_bundles(repo: Path, relative: str) -> bool:
    project = tomllib.loads((repo / "pyproject.toml").read_text()) if (repo / "pyproject.toml").is_file() else {}
    patterns = [p for cls in SCHEDULERS.values() for p in cls.bundle_excludes(project)]
    if any(re.search(pattern, relative) for pattern in patterns):
        return True
    ignored = subprocess.run(["git", "check-ignore", "-q", relative], cwd=repo, capture_output=True, check=False)
    return ignored.returncode == 0  # 1: not ignored; 128: not a git repository (a bundle then holds every file)


def hand_experiment_to_bundles(workflow: Any, repo: Path, path: Path) -> None:
    """Where Snakemake shares no sources with its jobs (a profile whose jobs run a bundle), each job runs the
    checkout's bundle in a folder of its own: jobs are handed the experiment relative to the checkout (this
    machine's path of it means nothing there)."""
    if SharedFSUsage.SOURCES in workflow.storage_settings.shared_fs_usage or not workflow.is_main_process:
        return
    relative = in_checkout(repo, path)
    settings = workflow.config_settings
    kept = [a for a in settings.config_args or [] if not a.startswith("experiment=")]
    settings.config_args = [*kept, *dict_to_key_value_args({"experiment": relative}, repr_obj=True)]


def profile_executor(repo: Path, profile: str | None) -> tuple[str, bool]:
    """(executor, shares_venv) of `snakemake --profile <profile>` (None: the local executor, this .venv). The jobs
    run this checkout's .venv as Snakemake decides it: an executor plugin that implies no shared file system
    shares nothing, else the profile's `shared-fs-usage` names `software-deployment` (Snakemake's default shares
    everything)."""
    if profile is None:
        return "local", True
    path = Path(profile) / "profile.yaml" if "/" in profile else repo / "profiles" / profile / "profile.yaml"
    if not path.is_file():
        known = sorted(p.parent.name for p in (repo / "profiles").glob("*/profile.yaml"))
        fix = f"use one of {', '.join(known)}, or a profile folder's path"
        raise PreflightError("--profile", [Violation("profile", f"{profile!r}: there is no {path}", fix)])
    settings = load_yaml(path, "profile") or {}
    executor = str(settings.get("executor", "local"))
    if executor not in ("local", "dryrun", "touch"):
        from snakemake_interface_executor_plugins.registry import ExecutorPluginRegistry

        if ExecutorPluginRegistry().get_plugin(executor).common_settings.implies_no_shared_fs:
            return executor, False
    usage = settings.get("shared-fs-usage")
    return executor, usage is None or str(SharedFSUsage.SOFTWARE_DEPLOYMENT) in [str(u) for u in usage]


@dataclass
class Graph:
    """One experiment's artifact graph as Snakemake sees it."""

    experiment_file: Path
    announce: bool
    allow_retrain: bool = False
    skip_smoke: bool = False  # a series' arms train without waiting for its smoke arm
    on_cluster: bool = False  # a cluster executor (remote jobs: Snakemake's --jobs), not the local one
    # Snakemake shares software deployment with the jobs (its `--shared-fs-usage`): they run this checkout's .venv.
    shares_venv: bool = True
    node_limits: NodeLimits = field(default_factory=lambda: NodeLimits(None, None, None))
    versions: list[str] = field(default_factory=list)  # the configured versions (the default target builds them)
    storage_root: str = ""
    workflow: Any = None
    experiment: Experiment = field(init=False)
    checked_experiment: CheckedExperiment = field(init=False)  # checked once, here: every plan is resolved from it
    leases: Leases | None = field(default=None, init=False)
    stopped: interrupts.QuietStoppedJobs | None = field(default=None, init=False)  # jobs an interrupt stopped
    inventory: Inventory = field(init=False)
    _held: dict[str, dict[str, Any]] | None = field(default=None, init=False)
    _plans: dict[str, Plan] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.experiment = load_experiment(self.experiment_file)
        self.checked_experiment = series.check(self.experiment, shares_venv=self.shares_venv)
        # The partition is asked only by the submitting process under a cluster executor (jobs re-read the
        # Snakefile after the submitter checked everything).
        ask_scheduler = self.announce and self.on_cluster
        violations = experiment_problems(self.checked_experiment, self.node_limits, ask_scheduler=ask_scheduler)
        if violations:
            raise PreflightError(str(self.experiment_file), violations)

    def bind_storage(self, workflow: Any, local_root: Path) -> None:
        self.workflow = workflow
        self.storage_root = scope_storage(workflow, local_root, self.experiment.name)
        self.inventory = Inventory(self.experiment_root)
        if workflow.storage_settings.default_storage_provider:
            fence_uploads(self.experiment_root)
            answer_from_listings(self.inventory)
            self.inventory.list_ahead()  # while Snakemake parses the rules: the DAG asks for every folder

    def terminal_stage(self, version: str) -> str:
        """The last artifact kind this invocation asks for, as the plan reports it."""
        settings = getattr(self.workflow, "dag_settings", None)
        return terminal_stage([str(t) for t in (settings.targets if settings else ())], version)

    @property
    def experiment_root(self) -> str:
        return experiment_root(self.storage_root, self.experiment.name)

    def working_directory(self) -> str:
        """Where Snakemake works on local storage: the experiment root. Snakemake makes it (and `.snakemake/` in
        it) as it parses; a dry run must leave no folder behind, so a root that did not exist is removed at exit,
        with every folder made above it, when the run was a dry run and nothing but that bookkeeping is there."""
        root = Path(self.experiment_root)
        if not root.exists():
            made = next(folder for folder in (root, *root.parents) if folder.parent.exists())
            atexit.register(self._forget_dry_run_folders, made, root)
        return str(root)

    def _forget_dry_run_folders(self, made: Path, root: Path) -> None:
        if not getattr(self.workflow, "dryrun", False):
            return
        bookkeeping = root / ".snakemake"
        kept = {made, *(folder for folder in root.parents if made in folder.parents), root, bookkeeping}
        others = [path for path in made.rglob("*") if path not in kept and bookkeeping not in path.parents]
        # A real run that started here meanwhile holds Snakemake's lock (a dry run takes none): leave it be.
        locked = any((bookkeeping / "locks").glob("*"))
        if not others and not locked:
            shutil.rmtree(made, ignore_errors=True)

    def plan(self, version: str) -> Plan:
        """The checked plan of one version (rlbuild/plan/versioning.py); stops on any violation or drift."""
        if version not in self._plans:
            if not self._plans and self.announce:
                read_ahead(self.inventory, self.keys_asked())
            source = str(self.experiment_file)
            plan = checked_plan(
                self.checked_experiment,
                version,
                self.storage_root,
                source,
                measure=self.announce,
                inventory=self.inventory,
            )
            self._plans[version] = plan
            if self.announce and series.plain_in_series(self.checked_experiment, version, "launch") is not None:
                shared = ", ".join(k for k in series.SHARED_STAGES if k in plan.records)
                print(
                    f"rlbuild plan: {self.experiment.name} @ {version}: the stages its arms share ({shared})",
                    file=sys.stderr,
                )
            elif self.announce:
                step_time = measured_step_time(self.experiment, plan)
                cost = plan_cost(self.experiment, plan, self.inventory)
                # A cluster executor's name is not known while the DAG is built (a dry run's is `dryrun`).
                executor = None if self.on_cluster else "local"
                print(format_plan(plan, self.terminal_stage(version), step_time, cost, executor), file=sys.stderr)
                for line in series.plan_lines(self.checked_experiment, version):
                    print(line, file=sys.stderr)
                for line in rebuild_reasons(plan, StoredRecords(plan, self.inventory).read):
                    print(line, file=sys.stderr)
                for key, holder in self.leases_now().items():
                    if key.endswith(f"/v{version}"):
                        print(f"  lease held     {key}: {describe(holder)}", file=sys.stderr)
        return self._plans[version]

    def keys_asked(self) -> list[str]:
        """The version keys this invocation plans: its targets' (`export/v2026.09.21`), else, for the default
        target, every configured version's. A target naming no artifact's version adds none."""
        settings = getattr(self.workflow, "dag_settings", None)
        targets = [str(t) for t in (settings.targets if settings else ())]
        named = self.versions if not targets or "all" in targets else [key_of_target(t) for t in targets]
        return series.expand(self.checked_experiment, [v for v in dict.fromkeys(named) if v])

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
            if (problem := series.plain_in_series(self.checked_experiment, wildcards.version, kind)) is not None:
                fail(PreflightError(str(self.experiment_file), [problem]))
            if not is_mutable(wildcards.version):
                return []
            return [f".fingerprints/{kind}/v{wildcards.version}/{plan.records[kind]['fingerprint']}"]

        return inputs

    def stage(self, kind: str, *, record: bool = False) -> Callable[[Any], str] | str:
        """A shared stage's output (or its record) as this version key uses it: in a series an input function,
        since an arm may use the plain version's, or an earlier arm's (rlbuild/plan/series.py); without arms every
        version uses its own, and the pattern spares Snakemake a function call in every job."""
        a = artifact(kind)
        if not self.experiment.arms:
            return a.record() if record else a.path()

        def path(wildcards: Any) -> str:
            key = self.checked(wildcards.version).key_of(kind)
            return a.record(key) if record else a.path(key)

        return path

    def targets(self, versions: list[str], pattern: str) -> list[str]:
        """`pattern` (an output with `{version}`) for each version `snakemake` builds with no target: each arm of
        a series (its smoke first; aliases are their arm's build), else the version itself."""
        keys = [key for version in versions for key in series.series_keys(self.checked_experiment, version)]
        return [pattern.format(version=key) for key in keys]

    def series_files(self, pattern: str) -> Callable[[Any], list[str]]:
        """Input function of the series report: `pattern` for every arm of the wildcard's version."""

        def files(wildcards: Any) -> list[str]:
            return self.targets([wildcards.version], pattern)

        return files

    def series_reports(self, versions: list[str]) -> list[str]:
        """The comparison report of each version of a series (none for an experiment without arms)."""
        return [series.report_path(version) for version in versions] if self.experiment.arms else []

    def train_inputs(self, wildcards: Any) -> list[str]:
        """The train rule's input function: the marker, and the refusal to force a completed fixed version.

        Runs while Snakemake builds the DAG, in dry runs too, before it deletes any output of a forced job.
        """
        version = wildcards.version
        plan = self.checked(version)
        forced = forced_by(getattr(self.workflow, "dag_settings", None), version)
        if forced and self._retrain_refused(plan):
            fail(retrain_refused(version, forced))
        return self.marker("train")(wildcards) + self._smoke_first(version)

    def _smoke_first(self, key: str) -> list[str]:
        """An arm of a series trains after its smoke succeeded (unless `--config skip_smoke=true`). `ancient`: a
        smoke built after an arm (added to the series later, or rerun) does not make Snakemake retrain the arm."""
        smoke = series.smoke_arm(self.experiment)
        arm = arm_of(key)
        if smoke is None or arm is None or arm == smoke or self.skip_smoke:
            return []
        return [ancient(artifact("train").path(arm_key(version_of(key), smoke)))]

    def guard_retraining(self, dag: Any) -> None:
        """`onstart:` the jobs Snakemake is about to run, whatever made it schedule them (-R, --forcerun, rerun
        triggers, upstream reruns): a completed fixed version's training is refused before anything is deleted."""
        for job in dag.needrun_jobs():
            if job.rule.name == artifact("train").rule:
                plan = self.plan(job.wildcards_dict["version"])
                if self._retrain_refused(plan) and not _only_reemits(dag, job, plan):
                    fail(retrain_refused(plan.version, "a rerun this invocation scheduled"))

    def leases_now(self) -> dict[str, dict[str, Any]]:
        """The leases held under this experiment when the graph was built (listed once)."""
        if self._held is None:
            self._held = held_leases(self.experiment_root)
        return self._held

    def take_leases(self, jobs: Any) -> None:
        """`onstart:` take the lease of every artifact this run will build, before the first job starts; refuse
        in one line when another run holds one (rlbuild/ops/lease.py)."""
        self.leases = Leases()
        atexit.register(self.leases.release_all)
        arm_jobs(self.experiment_root, self.leases.holder.run, os.environ)
        for job in jobs:
            kind = RULE_KIND.get(job.rule.name)
            if kind is None:
                continue
            version = job.wildcards_dict["version"]
            uri = lease_uri(self.plan(version).experiment_root, kind, version)
            try:
                self.leases.acquire(uri, f"{artifact(kind).path(version)} of {self.experiment.name}")
                self._unchanged_since_planned(kind, version)
            except RlbuildError as error:
                self.leases.release_all()
                fail(error)
        self.leases.start_heartbeat()
        self.leases.clear_abandoned(self.experiment_root, self._complete)

    def _complete(self, kind: str, version: str) -> bool:
        """The artifact's record is in storage now (asked, not listed: the run is about to start)."""
        return kind in RULE_KIND.values() and storage.exists(
            storage.join(self.experiment_root, artifact(kind).record(version))
        )

    def _unchanged_since_planned(self, kind: str, version: str) -> None:
        """Under its lease, the artifact's record is still what the plan was made from: one written after the
        listing (another run completed it meanwhile) stops this run before it builds anything."""
        record = self.plan(version).uri(artifact(kind).record(version))
        if self.inventory.changed(record):
            raise PlannedStateChangedError(
                f"{record} changed in storage after this run planned (another run wrote it meanwhile); nothing was "
                "run. Run again: the new plan starts from what storage holds now."
            )

    def release_leases(self) -> None:
        """`onsuccess:`/`onerror:` the run is over; its artifacts' records say what it built."""
        if self.leases is not None:
            self.leases.release_all()

    def listen_for_interrupts(self) -> None:
        """`onstart:` Ctrl-C stops running jobs cleanly (a training at its next step) instead of waiting them out;
        what stopped on request is reported by the line `onerror` ends with, not as a failure."""
        self.stopped = interrupts.forward_to_jobs()

    def end_if_interrupted(self, workflow: Any) -> None:
        """`onerror:` a run that an interrupt stopped, and nothing else, ends with one line of ours (what stopped
        where, the command that resumes it), then ends by the interrupt's own signal, which a shell reports as 130
        (rlbuild/job/interrupts.py); a run in which a job also failed keeps Snakemake's error and exit code, after
        that line."""
        signal_name, quiet = interrupts.interrupted_by(), self.stopped
        if quiet is None or (not quiet.stopped and signal_name is None):
            return
        jobs = {workflow.dag.jobid(job): job for job in workflow.dag.jobs}
        where = [self._stopped_at(jobs[jobid]) for jobid in quiet.stopped if jobid in jobs]
        command = interrupts.snakemake_command(sys.argv)
        print(interrupts.stopped_line(signal_name, where, command), file=sys.stderr, flush=True)
        if quiet.failed:
            return
        if signal_name is not None:
            interrupts.end_by_signal(signal.Signals[signal_name])
        raise SystemExit(INTERRUPTED_EXIT_CODE)  # past Snakemake's handlers: its lock is released on the way

    def _stopped_at(self, job: Any) -> str:
        """Where a stopped job stopped: a training at its last checkpoint (the interrupt checkpointed the step
        under way), any other job anywhere (a rerun builds it again)."""
        kind, version = RULE_KIND.get(job.rule.name, job.rule.name), job.wildcards_dict.get("version")
        if version is None:
            return kind
        if kind != "train":
            return f"{kind} of v{version} (a rerun builds it again)"
        root = self.plan(version).launch.artifacts.checkpoint_root
        try:
            step = checkpoints.latest_step(root)
        except RlbuildError as error:
            return f"train/v{version} (its last checkpoint cannot be read: {error})"
        if step is None:
            return f"train/v{version} before its first checkpoint (a rerun starts it at step 0)"
        return f"train/v{version} at step {step}, last checkpoint {checkpoints.step_uri(root, step)}"

    def _retrain_refused(self, plan: Plan) -> bool:
        immutable = not is_mutable(plan.version)
        return immutable and not self.allow_retrain and StoredRecords(plan, self.inventory).complete("train")

    def stage_model_inputs(self, wildcards: Any) -> dict[str, Any]:
        plan = self.checked(wildcards.version)
        inputs: dict[str, Any] = {"marker": self.marker("stage_model")(wildcards)}
        if plan.uses_base_model:
            inputs["base_model"] = artifact("base_model").path(plan.key_of("base_model"))
        return inputs

    def hand_env_to_jobs(self, workflow: Any) -> None:
        """`execution.env` reaches every job's tasks: set here, local jobs inherit it; declared to Snakemake, an
        executor plugin hands it to its scheduler with the rest of the declared environment, or the job inherits the
        submitting environment (`restrict_job_environment` keeps it). Jobs re-read the Snakefile and set the same
        values."""
        env = self.experiment.execution.env
        os.environ.update(env)
        if env:
            workflow.register_envvars(*env)

    def restrict_job_environment(self, workflow: Any) -> None:
        """Before the first submission (the Snakefile's `onstart`): under a scheduler whose jobs inherit the
        submitting process's environment, cut this process's environment to what jobs may receive."""
        plugin = getattr(workflow, "executor_plugin", None)
        scheduler = executor_scheduler(plugin.name) if plugin is not None else None
        if scheduler is None or not scheduler.inherits_submit_environment:
            return
        removed = restrict_to_forwarded(os.environ, self.experiment.execution.env, scheduler.variable_prefixes)
        if removed:
            print(f"rlbuild: not passed to {scheduler.title} jobs: {', '.join(removed)}", file=sys.stderr)

    def job_resources(self, kind: str) -> dict[str, int | str]:
        """Resources of the export or eval job: the CPUs and memory the experiment gives it (`execution.export` /
        `execution.eval`), and what each scheduler's executor reads of it."""
        size = getattr(self.experiment.execution, kind)
        request = JobRequest(
            cpu=size.cpu, memory=size.memory, **self._node_runtime(gpus=False, episodes=kind == "eval")
        )
        resources = {"cpus_per_task": size.cpu, "mem_mb": size.mem_mb}
        return self._for_executor(resources | scheduling.rule_resources(self.experiment, request))

    def gang_resources(self) -> dict[str, int | str]:
        """Resources a cluster executor reads to run `train` as one gang of whole nodes, and those the rule's
        command reads (`COMMAND_RESOURCES`: how far one train job may go)."""
        gang = scheduling.gang_of(self.experiment)
        resources: dict[str, int | str] = {
            "gpu_nodes": gang.num_nodes,
            "gpus_per_node": gang.gpus_per_node,
            "gpu_variant": gang.gpu_variant,
            **COMMAND_RESOURCES,
        }
        request = JobRequest(gang=gang, **self._node_runtime(gpus=True, episodes=True))
        return self._for_executor(resources | scheduling.rule_resources(self.experiment, request))

    def _node_runtime(self, *, gpus: bool, episodes: bool) -> dict[str, Any]:
        """What a job's nodes run where they do not share this checkout's .venv: the experiment's image, or a
        set-up of uv.lock with the extras the runtime preflight judged (rlbuild/plan/noderuntime.py): `gpu` for the
        GPU nodes, `harbor` for the jobs that play episodes (train, eval) where Harbor runs them."""
        if self.shares_venv:
            return {}
        runtime = node_runtime(self.experiment, shares_venv=False)
        if runtime.image:
            return {"image": runtime.image}
        wanted = {GPU_EXTRA: gpus, HARBOR_EXTRA: episodes}
        return {"extras": tuple(extra for extra in runtime.extras if wanted.get(extra))}

    def _for_executor(self, resources: dict[str, int | str]) -> dict[str, Any]:
        """The resources as the executor that runs the job sees them: those only another scheduler's executor
        reads are dropped, so a job's resource line lists only what is asked of its scheduler. The executor is known
        only when a job is made (not while the Snakefile is read): each such resource is a function, and Snakemake
        drops one that answers None. A dry run for a cluster executor shows every scheduler's. Snakemake's own
        process with no cluster executor (no `--jobs`: Snakemake refuses a cluster executor without) runs the jobs
        itself: no scheduler reads them, and they are dropped here (350 jobs' functions cost a dry run 0.1 s)."""
        if self.announce and not self.on_cluster:
            return {key: value for key, value in resources.items() if resource_owner(key) is None}
        return {
            key: _only_under(self, owner, value) if (owner := resource_owner(key)) else value
            for key, value in resources.items()
        }


def _only_under(graph: Graph, scheduler: str, value: int | str) -> Callable[..., int | str | None]:
    def resource(wildcards: Any) -> int | str | None:
        plugin = getattr(graph.workflow, "executor_plugin", None)
        name = plugin.name if plugin is not None else "dryrun"
        if name == "dryrun":  # which cluster executor a dry run stands for is not known: show every scheduler's
            return value if graph.on_cluster else None
        found = executor_scheduler(name)
        return value if found is not None and found.name == scheduler else None

    return resource


def forced_by(settings: Any, version: str) -> str:
    """What in this invocation forces `train` of `version` to rerun ("" when nothing does)."""
    if settings is None:
        return ""
    if settings.forceall:
        return "--forceall"
    for item in sorted(map(str, settings.forcerun)):
        kind = kind_of_target(item)
        if item in TRAIN_AND_UPSTREAM or (
            kind and artifact(kind).rule in TRAIN_AND_UPSTREAM and f"/v{version}" in item
        ):
            return f"--forcerun {item}"
    if settings.forcetargets and any(kind_of_target(str(t)) == "train" for t in settings.targets):
        return "--force on a train target"
    return ""


def retrain_refused(version: str, cause: str) -> RetrainRefusedError:
    train = artifact("train")
    return RetrainRefusedError(
        f"{train.path(version)} is a completed training of immutable version {version}, and {cause} would "
        f"retrain it; nothing was deleted or run. To retrain it anyway add --config allow_retrain=true; to train "
        f"other settings use a new version (e.g. {version}.1 or a new date)."
    )


def _only_reemits(dag: Any, job: Any, plan: Plan) -> bool:
    """A training Snakemake saw interrupted (its Snakemake was killed) may still have finished its artifact; the
    rerun `--rerun-incomplete` asks for then deletes it, and the train job writes terminal.json again from the
    final checkpoint without training (trainer/loop.py). Only that case passes the guard."""
    marked = dag.workflow.async_run(dag.workflow.persistence.incomplete(job))  # Snakemake's own incomplete marks
    final = plan.recipe.trainer.max_steps
    return bool(marked) and checkpoints.latest_step(plan.launch.artifacts.checkpoint_root) == final
