# rlbuild: every artifact of an RL experiment is a file target; the whole plan is checked before any job runs.
# Logic lives in the `rlbuild` library and `trainer`; rules are inputs, outputs, resources and one call.
import os
import shlex
import sys
from pathlib import Path

from rlbuild.artifacts import BY_KIND as ARTIFACT
from rlbuild.cli import ALLOW_RETRAIN
from rlbuild.errors import RlbuildError
from rlbuild.workflow import Graph, experiment_file, fail


configfile: str(Path(workflow.basedir) / "config" / "config.yaml")


REPO = Path(workflow.basedir)
EXPERIMENT_FILE = experiment_file(REPO, str(config["experiment"]))

try:
    GRAPH = Graph(
        experiment_file=EXPERIMENT_FILE,
        announce=workflow.is_main_process,
        on_cluster=workflow.resource_settings.nodes is not None,
    )
    GRAPH.bind_storage(workflow, REPO / config["storage_root"])
except RlbuildError as error:
    fail(error)

EXP = GRAPH.experiment
if config.get("allow_retrain"):
    # An environment variable, not a rule param: a param would count as provenance and retrigger training later.
    os.environ[ALLOW_RETRAIN] = "1"
# The interpreter running Snakemake (locally, or inside a spawned job) runs the rule's command too.
RLBUILD = f"{shlex.quote(sys.executable)} -m rlbuild"
ARGS = shlex.join(["--experiment", str(EXPERIMENT_FILE), "--storage-root", GRAPH.storage_root])

if not workflow.storage_settings.default_storage_provider:

    workdir: GRAPH.experiment_root


wildcard_constraints:
    version=r"[^/]+",


onstart:
    GRAPH.on_start(workflow)


# Staging and launch resolution run beside Snakemake under every executor: on clusters the submitting host is
# the one that reaches model hubs (compute nodes often cannot).
localrules:
    all,
    identity_marker,
    base_model,
    stage_model,
    stage_data,
    resolve_launch,


rule all:
    input:
        expand(ARTIFACT["eval"].path(), version=config["versions"]),
    default_target: True


rule identity_marker:
    # A new fingerprint of a `dev` artifact is a new, missing input: Make semantics rebuild what changed.
    output:
        ".fingerprints/{kind}/v{version}/{fingerprint}",
    shell:
        "touch {output}"


include: "rules/stage.smk"
include: "rules/launch.smk"
include: "rules/train.smk"
include: "rules/export.smk"
include: "rules/eval.smk"
