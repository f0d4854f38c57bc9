"""Snakemake executor plugin for Marin's Iris scheduler.

CPU rules become single Iris tasks; a rule that declares `gpu_nodes` becomes one co-scheduled gang of whole
nodes whose tasks run the `rlbuild.schedulers.gangtask` bootstrap (Ray across the nodes, then the Snakemake job on
rank 0).
"""

import os
import sys
from dataclasses import dataclass, field
from typing import Optional

from snakemake_interface_executor_plugins.settings import CommonSettings, ExecutorSettingsBase

from rlbuild.core.storage import endpoint_violation
from snakemake_executor_plugin_iris.errors import IrisSettingError
from snakemake_executor_plugin_iris.executor import Executor
from snakemake_executor_plugin_iris.requests import ON_INTERRUPT, PRIORITIES, setting_problems

__all__ = ["Executor", "ExecutorSettings", "common_settings"]

common_settings = CommonSettings(
    non_local_exec=True,
    # The file-system model is the profile's `shared-fs-usage`, which True here would make Snakemake discard:
    # profiles/iris shares no sources (every job carries the checkout as an Iris bundle, not Snakemake's source
    # archive) and moves artifacts through the default storage provider; `--shared-fs-usage sources` (a cluster that
    # sees the checkout at the same path) makes jobs `cd` into it instead.
    implies_no_shared_fs=False,
    job_deploy_sources=False,
    # Secrets (S3 keys) must not be written into the job command: the executor hands the environment to Iris.
    pass_envvar_declarations_to_cmd=False,
    auto_deploy_default_storage_provider=False,
    init_seconds_before_status_checks=1,
)


def _help(text: str, **extra: object) -> dict[str, object]:
    return {"help": text, **extra}


# Field types stay real objects (no `from __future__ import annotations`): Snakemake coerces CLI and profile
# values with them, and its parser understands typing.Optional but not `X | None`.


@dataclass
class ExecutorSettings(ExecutorSettingsBase):
    controller_url: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata=_help("Iris controller URL, e.g. http://127.0.0.1:10000 (or a tunnel to it)", env_var=True),
    )
    cluster: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata=_help(
            "Iris cluster name whose endpoint `iris login` (or a local cluster) recorded under "
            "~/.config/marin/credentials; used when --iris-controller-url is not given",
            env_var=True,
        ),
    )
    coschedule: str = field(
        default="leafgroup",
        metadata=_help("worker attribute a gang's nodes must share (leafgroup, nvlink.domain, pool, ...)"),
    )
    priority: str = field(
        default="interactive",
        metadata=_help("priority band for jobs whose rule declares no iris_priority", choices=list(PRIORITIES)),
    )
    node_cpu: float = field(default=48.0, metadata=_help("CPUs per gang node unless the rule declares iris_cpu"))
    node_memory: str = field(default="512GB", metadata=_help("memory per gang node (else: iris_memory)"))
    node_disk: str = field(default="500GB", metadata=_help("disk per gang node unless the rule declares iris_disk"))
    max_retries: int = field(
        default=1,
        metadata=_help("Iris retries of a failed job, the whole gang restarting (else: iris_max_retries)"),
    )
    scheduling_timeout: int = field(
        default=1800,
        metadata=_help("seconds a job may wait for placement before Iris marks it unschedulable"),
    )
    join_timeout: int = field(
        default=1800,
        metadata=_help("seconds for a gang's Ray head to come up and all its nodes to join"),
    )
    status_interval: Optional[int] = field(  # noqa: UP045
        default=None,
        metadata=_help("seconds between status checks (default: Snakemake's --seconds-between-status-checks)"),
    )
    rules: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata=_help(
            "comma-separated rules that run on Iris; the others run as local subprocesses of Snakemake. "
            "Default: every rule. A rule declaring gpu_nodes always runs on Iris"
        ),
    )
    cpu_pool: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata=_help("pin jobs without GPUs to workers whose `pool` attribute has this value", env_var=True),
    )
    env: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata=_help(
            "comma-separated extra environment variables to forward to tasks (besides HF_TOKEN, WANDB_*, "
            "DAYTONA_*, RLBUILD_*, the S3 storage settings); AWS_*/R2_* are refused"
        ),
    )
    rendezvous_root: Optional[str] = field(  # noqa: UP045
        default=None,
        metadata=_help(
            "where gangs without a launch document rendezvous (default: <default storage prefix>/.iris/rendezvous); "
            "gangs with one use its ray.rendezvous_dir"
        ),
    )
    log_tail: int = field(default=40, metadata=_help("lines of each task's log shown when a job fails"))
    on_interrupt: str = field(
        default="keep",
        metadata=_help(
            "what Ctrl-C (Snakemake stopping) does to running gangs: keep (default: they train on and write their "
            "outputs; the next run adopts them) or cancel (Iris kills them; work since the last checkpoint is lost)",
            choices=list(ON_INTERRUPT),
        ),
    )

    def __post_init__(self) -> None:
        # Settings are parsed on every start, dry runs included (which never reach the executor itself): every
        # problem is reported at once, before anything is submitted.
        problems = setting_problems(self)
        if problems:
            raise IrisSettingError("iris settings", "; ".join(problems), "fix these executor settings (--iris-*)")
        # Snakemake's S3 plugin makes its client right after these settings, before the Snakefile (and rlbuild's
        # own check) runs: a placeholder endpoint would end in botocore's traceback instead of this line.
        if endpoint := endpoint_violation(os.environ):
            raise IrisSettingError(endpoint.field, os.environ[endpoint.field], f"{endpoint.message}; {endpoint.fix}")
        if not self.controller_url and not self.cluster:
            print(
                "iris: no controller configured: set SNAKEMAKE_IRIS_CONTROLLER_URL (or SNAKEMAKE_IRIS_CLUSTER); "
                "a dry run plans without one, a real run stops here",
                file=sys.stderr,
            )
