"""The launch document (`launch.yaml`), typed: the one document every stage after resolve_launch reads.

Sections name what they configure: `run` and `runtime` say what this is and which code runs it, `allocation`
the gang's whole nodes (the same under every scheduler) and `schedulers` each scheduler's settings the
experiment sets (placement: sizes, queues, limits), `ingress` how the driver reaches the rollout engines, `ray`
the cluster bootstrap, `artifacts` where outputs go, `inputs` the immutable staged model and data, `recipe` the
trainer's settings, `env` the experiment's execution.env (every node checks its tasks got it). All URIs are
absolute: a local absolute path or `s3://bucket/key`. The builder (`rlbuild.plan.resolve`) is its only writer;
the trainer parses it once with `load_launch` and reads attributes. Secrets never appear in it.
"""

from __future__ import annotations

import re
from typing import Literal

import yaml
from pydantic import Field, ValidationError

from rlbuild.contracts.recipe import Recipe
from rlbuild.core import storage
from rlbuild.core.errors import RlbuildError
from rlbuild.core.validation import StrictModel

SCHEMA_VERSION = 3  # 3: `allocation` and `schedulers` (2 kept the allocation inside one scheduler's section)


class LaunchDocumentError(RlbuildError):
    """A launch document that cannot be read or does not follow the schema; regenerate it with resolve_launch."""


class Run(StrictModel):
    id: str = Field(
        description="`<experiment>-<version key>-<launch fingerprint[:8]>`: names the run in logs and W&B, one per "
        "configuration"
    )
    name: str = Field(description="the experiment's name")
    version: str = Field(description="YYYY.MM.DD[.N] (immutable) or dev; `<version>@<arm>` for an arm of a series")
    seed: int = Field(ge=0, description="the experiment's seed")
    fingerprint: str = Field(description="the launch artifact's fingerprint")


# A SIF file on the file system the nodes share, pinned by the sha256 of its bytes: `/abs/path/x.sif@sha256:<hex>`.
PINNED_SIF = re.compile(r"^(/[^@\s]+\.sif)@sha256:([0-9a-f]{64})$")


def apptainer_target(image: str | None) -> str | None:
    """What `apptainer exec` runs for a runtime image Apptainer runs: the SIF file (its digest is rlbuild's pin,
    checked by preflight) or the docker:// reference as written; None for no image or an OCI task image."""
    if image is None:
        return None
    if image.startswith("docker://"):
        return image
    sif = PINNED_SIF.match(image)
    return sif.group(1) if sif else None


class Runtime(StrictModel):
    entrypoint: Literal["grpo", "fully_async"] = Field(description="the training loop")
    strategy: Literal["fsdp2", "megatron"] = Field(description="how the policy is sharded")
    source_digest: str = Field(description="digest of the code that runs in the job (rlbuild.contracts.runtime)")
    image: str | None = Field(
        default=None,
        description="the container image the nodes run (pinned by digest: an OCI task image, or a SIF file or "
        "docker:// reference run with apptainer); None: set up from uv.lock, or this .venv where jobs share it",
    )
    image_provides: dict[str, str] | None = Field(
        default=None, description="the packages the image declares (torch first), checked by each node before Ray"
    )


CPU_VARIANT = "cpu"  # a topology of CPU ranks (the embedded default): whole nodes, no GPU request


class Allocation(StrictModel):
    num_nodes: int = Field(ge=1, description="whole nodes of the gang")
    gpus_per_node: int = Field(ge=1, description="GPUs on each node")
    gpu_variant: str = Field(description="e.g. H100; `cpu` for CPU ranks")


SchedulerSettings = dict[str, str | int | float | bool | None]


class Ingress(StrictModel):
    mode: Literal["ray_actors"] = Field(
        description="the driver calls the rollout engines as Ray actors in the gang (no HTTP endpoint)"
    )


class Ray(StrictModel):
    address: str | None = Field(description="a Ray cluster to join; null: RAY_ADDRESS if set, else a private Ray")
    rendezvous_dir: str = Field(description="where a gang's ranks meet (one folder per job and attempt)")


class Artifacts(StrictModel):
    checkpoint_root: str = Field(description="checkpoints (temporary storage, expires with its TTL)")
    attempts_root: str = Field(description="per-attempt state: rendezvous, heartbeats, Ray logs")
    export_root: str = Field(description="where the export rule publishes the terminal checkpoint")
    terminal_manifest_uri: str = Field(description="terminal.json: written once, last")
    metrics_uri: str = Field(description="the run's metrics.jsonl, beside terminal.json: written whole at the end")
    metrics_segments_root: str = Field(
        description="the metrics stream while the run goes (rlbuild/contracts/metricstream.py)"
    )
    trajectories_root: str = Field(
        description="an agent run's sampled training episodes, one JSONL file per step (temporary storage)"
    )
    resume_checkpoint_count: int = Field(ge=1, le=5, description="checkpoints kept for resuming")


class Input(StrictModel):
    uri: str = Field(description="a staged file or directory (a manifest at or above it)")
    identity: str = Field(description="the staged artifact's identity, copied into terminal.json")


class Inputs(StrictModel):
    model: Input = Field(description="the staged model folder (with its tokenizer)")
    train_data: list[Input] = Field(min_length=1, description="staged JSONL files of {prompt, answer} rows")
    validation_data: list[Input] = Field(description="held-out JSONL files")


class LaunchDocument(StrictModel):
    schema_version: Literal[3] = Field(description="bumped when a field changes meaning")
    run: Run
    runtime: Runtime
    allocation: Allocation = Field(description="the gang's whole nodes")
    schedulers: dict[str, SchedulerSettings] = Field(
        description="each scheduler's `execution.<name>` section the experiment sets, by name (none: local runs "
        "only); placement, never part of an identity"
    )
    ingress: Ingress
    ray: Ray
    artifacts: Artifacts
    inputs: Inputs
    recipe: Recipe
    env: dict[str, str] = Field(
        default_factory=dict,
        description="the experiment's execution.env: plain variables every task of the job gets; nodes check them",
    )
    credentials: list[str] = Field(
        default_factory=list,
        description="names of the submitter's variables the job needs (the sandbox provider's credentials): "
        "forwarded to the job by name, never written here or anywhere; nodes check they arrived",
    )


def dump_launch(document: LaunchDocument) -> str:
    """The document as YAML, fields in declaration order: the same inputs give byte-identical output."""
    return yaml.safe_dump(document.model_dump(mode="json"), sort_keys=False, default_flow_style=False, width=120)


def parse_launch(raw: object, where: str) -> LaunchDocument:
    written = raw.get("schema_version") if isinstance(raw, dict) else None
    if isinstance(written, int) and written != SCHEMA_VERSION:
        raise LaunchDocumentError(
            f"{where} is a launch document of schema {written}, written by another rlbuild; this one reads schema "
            f"{SCHEMA_VERSION}: re-resolve it (`snakemake --forcerun resolve_launch <target>` while nothing of "
            "the version is trained; else a new version, or dev)"
        )
    try:
        return LaunchDocument.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise LaunchDocumentError(
            f"{where} is not a launch document of schema {SCHEMA_VERSION} ({problems}); regenerate it with the "
            "resolve_launch rule"
        ) from None


def load_launch(uri: str) -> LaunchDocument:
    """Read and validate a launch document from a local path or s3:// URI."""
    text = storage.read_text(uri)
    if text is None:
        raise LaunchDocumentError(f"launch document {uri} does not exist; run the resolve_launch rule first")
    return launch_from_text(text, uri)


def launch_from_text(text: str, where: str) -> LaunchDocument:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise LaunchDocumentError(f"{where} is not YAML ({exc}); regenerate it with resolve_launch") from None
    return parse_launch(raw, where)
