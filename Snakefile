# rlbuild: every artifact of an RL experiment is a file target; the whole plan is checked before any job runs.
# Logic lives in the `rlbuild` library and `trainer`; rules are inputs, outputs, resources and one call.
import gc
import os
import sys
from pathlib import Path

from snakemake_interface_executor_plugins.settings import SharedFSUsage

from rlbuild.contracts.artifacts import BY_KIND as ARTIFACT
from rlbuild.core.errors import RlbuildError
from rlbuild.core.wire import ALLOW_RETRAIN
from rlbuild.workflow import (
    Graph,
    clear_local_copies,
    experiment_file,
    fail,
    hand_experiment_to_bundles,
    report_with_results,
    rule_param,
    workflow_config,
)

# Every full collection walks all tracked objects. Those of the imports (Snakemake, its plugins, rlbuild: some
# 200,000) never become garbage, and the dry run of a busy experiment triggers several collections while
# it builds its jobs: frozen, they are left out of every walk (benchmarks/dry_run.py, 50 versions on S3).
gc.freeze()


configfile: str(Path(workflow.basedir) / "config" / "config.yaml")


REPO = Path(workflow.basedir)
try:
    CONFIG = workflow_config(config)
    EXPERIMENT_FILE = experiment_file(REPO, CONFIG.experiment)
    GRAPH = Graph(
        EXPERIMENT_FILE,
        announce=workflow.is_main_process,
        allow_retrain=CONFIG.allow_retrain,
        skip_smoke=CONFIG.skip_smoke,
        on_cluster=workflow.resource_settings.nodes is not None,
        shares_venv=SharedFSUsage.SOFTWARE_DEPLOYMENT in workflow.storage_settings.shared_fs_usage,
        node_limits=CONFIG.node_limits,
        versions=CONFIG.versions,
    )
    GRAPH.bind_storage(workflow, REPO / CONFIG.storage_root)
    hand_experiment_to_bundles(workflow, REPO, EXPERIMENT_FILE)
except RlbuildError as error:
    fail(error)

if CONFIG.allow_retrain:
    # An environment variable, not a rule param: params are provenance the run's config should not change.
    os.environ[ALLOW_RETRAIN] = "1"
report_with_results(workflow, GRAPH)
GRAPH.hand_env_to_jobs(workflow)
# The interpreter running Snakemake (locally, or inside a spawned job) runs the rule's command too. Rules take
# these as `params` (`rule_param`: a path holding braces is not read as wildcards), and every value reaches the
# shell quoted (`:q`).
RLBUILD = rule_param([sys.executable, "-m", "rlbuild"])
ARGS = rule_param(["--experiment", str(EXPERIMENT_FILE), "--storage-root", GRAPH.storage_root])
EXPERIMENT = rule_param(str(EXPERIMENT_FILE))

if not workflow.storage_settings.default_storage_provider:

    workdir: GRAPH.working_directory()


# A job's command starts with the terminal's SIGINT ignored: Ctrl-C reaches a job as the SIGTERM Snakemake passes
# on (rlbuild/job/interrupts.py), and a SIGINT landing while a job's Python is still starting (before its handlers)
# would end it with a "Fatal Python error" and exit 1, read as a failure. `python -m rlbuild` listens to both
# signals again once it has started (interrupts.raise_on_signals). Snakemake's own prefix is kept.
shell.prefix("set -euo pipefail; trap '' INT; ")


wildcard_constraints:
    version=r"[^/]+",


# Staging and launch resolution run beside Snakemake under every executor: on clusters the submitting host is
# the one that reaches model hubs (compute nodes often cannot).
localrules:
    all,
    identity_marker,
    base_model,
    stage_model,
    stage_data,
    resolve_launch,


onstart:
    GRAPH.guard_retraining(workflow.dag)
    GRAPH.take_leases(workflow.dag.needrun_jobs())
    clear_local_copies(workflow.dag.needrun_jobs())  # a kill during an upload leaves them behind
    GRAPH.restrict_job_environment(workflow)
    GRAPH.listen_for_interrupts()  # Ctrl-C stops running jobs cleanly; onerror reports them in one line


onsuccess:
    GRAPH.release_leases()


onerror:
    GRAPH.release_leases()
    GRAPH.end_if_interrupted(workflow)


rule all:
    """Every configured version evaluated (and published, where the experiment sets execution.publish); in a
    series (arms: in the experiment file), every arm, and the series' comparison report."""
    input:
        GRAPH.targets(CONFIG.versions, ARTIFACT["eval"].path()),
        # The optional publish stage: only where the experiment sets execution.publish.
        GRAPH.targets(CONFIG.versions if GRAPH.experiment.execution.publish else [], "publish/v{version}.json"),
        GRAPH.series_reports(CONFIG.versions),
    default_target: True


rule identity_marker:
    """Mark a `dev` artifact's fingerprint as built: a new fingerprint is a new, missing input, so Make semantics
    rebuild what changed."""
    output:
        ".fingerprints/{kind}/v{version}/{fingerprint}",
    log:
        ".fingerprints/{kind}/v{version}/{fingerprint}.log",
    shell:
        "touch {output:q} 2> {log:q}"


include: "rules/stage.smk"
include: "rules/launch.smk"
include: "rules/train.smk"
include: "rules/export.smk"
include: "rules/eval.smk"
include: "rules/publish.smk"
include: "rules/compare.smk"
