"""The experiment file (`config/experiments/<name>.yaml`) as pydantic models.

Field names are the user-facing contract. Unknown keys are errors with a "did you mean".
Structural problems (types, unknown keys, missing fields) are collected all at once.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from datetime import date
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, create_model, field_validator

from rlbuild.contracts.artifacts import DEFAULT_LICENSE
from rlbuild.contracts.launch import PINNED_SIF
from rlbuild.contracts.recipe import SandboxBackend
from rlbuild.core.errors import Violation, quote
from rlbuild.core.validation import LABEL, StrictModel, node_size, size_bytes
from rlbuild.core.wire import job_env_problems
from rlbuild.schedulers.registry import SCHEDULERS

# ASCII digits only (`\d` alone also takes full-width and Arabic-Indic ones, which int() reads as the same number).
CALENDAR_VERSION = re.compile(r"(\d{4})\.(\d{2})\.(\d{2})(?:\.(\d{1,4}))?", re.ASCII)
MUTABLE_VERSION = "dev"
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]*$")

# Upper bounds far beyond any cluster, so that no check's cost grows with a mistyped number's magnitude.
MAX_NODES = 4096
MAX_GPUS_PER_NODE = 64
MAX_PARALLEL = 1024  # TP, PP, DP, EP of one engine
MAX_ENGINES = 65536
MAX_BATCH = 2**20  # prompts (or samples) in a batch
MAX_SAMPLES_PER_PROMPT = 4096
# Every generator the trainer seeds (Python, torch, numpy) accepts it, also after deriving per-step seeds.
MAX_SEED = 2**32 - 1
MAX_NAME_LENGTH = 63  # the experiment's folder, S3 keys and scheduler job names carry it
MAX_SOURCE_LENGTH = 1024  # an S3 key's limit
# An arm's name is the tail of its version key (`2026.09.21@kl-low`): a path segment without '.' or '@'.
ARM_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
MAX_ARMS = 64
MAX_ARM_NAME_LENGTH = 40
# What an arm may not overlay: the series' name is every arm's, and arms do not nest.
NOT_OVERLAID = ("name", "arms")


# An OCI reference pinned by content: `registry/name@sha256:<64 hex>` (a tag may stand before the digest).
PINNED_IMAGE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
# What Apptainer runs where jobs share this checkout: an OCI reference it pulls (`docker://...@sha256:`), or a SIF
# file on the shared file system pinned by the sha256 of its bytes (`/abs/path/x.sif@sha256:`), which preflight
# hashes on the submitting host.
PINNED_DOCKER = re.compile(r"^docker://[a-z0-9][a-z0-9._/:-]*@sha256:[0-9a-f]{64}$")
MAX_IMAGE_LENGTH = 512
# What an image declares it holds: a package and its version (or a prefix of its release: torch "2.11").
ProvidedPackage = Literal["torch", "vllm", "transformers", "ray", "harbor"]
VERSION_TEXT = r"^[0-9][0-9A-Za-z.+_-]*$"


class Runtime(StrictModel):
    entrypoint: Literal["grpo", "fully_async"]
    strategy: Literal["fsdp2", "megatron"]
    image: str | None = Field(
        default=None,
        max_length=MAX_IMAGE_LENGTH,
        description="the container image cluster nodes run, pinned by digest: an OCI task image name@sha256:... "
        "where jobs run a bundle of the checkout; a SIF file /path/x.sif@sha256:... or docker://name@sha256:... (run "
        "with apptainer exec) where they share it; without one, nodes set up from the bundle's uv.lock or run this "
        "checkout's .venv",
    )
    image_provides: dict[ProvidedPackage, Annotated[str, Field(max_length=64, pattern=VERSION_TEXT)]] | None = Field(
        default=None,
        description="what runtime.image holds, e.g. {torch: '2.11', vllm: '0.20.2rc0'}: preflight judges the rollout "
        "backend from it, and each node checks it against what it finds before Ray starts",
    )

    @field_validator("image")
    @classmethod
    def _pinned(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if value.split("@", 1)[0].endswith(".sif"):  # a file, not a registry name that happens to match
            if PINNED_SIF.match(value):
                return value
        elif PINNED_IMAGE.match(value) or PINNED_DOCKER.match(value):
            return value
        return _unpinned(value)


def _unpinned(value: str) -> str:
    """Raise the refusal of a floating image reference, with the way to pin it of its kind."""
    if value.startswith("docker://") or value.endswith(".sif") or ".sif@" in value:
        path = value.split("@", 1)[0]
        fix = (
            f"Pin it as {path}@sha256:<64 hex digits> (`sha256sum {path}` prints the SIF file's digest; a SIF "
            "path must be absolute, on the file system the nodes share)"
            if not value.startswith("docker://")
            else f"Pin it as docker://<name>@sha256:<64 hex digits> (`docker buildx imagetools inspect "
            f"{path.removeprefix('docker://')}` prints the digest)"
        )
        what = (
            "is not an absolute path"
            if "@sha256:" in value
            else "is not pinned by digest: a path or tag can hold "
            "another image tomorrow, and the run's identity would not say which one trained"
        )
        raise ValueError(f"{value!r} {what}. {fix}")
    name = value.split("@", 1)[0]
    base = name.rsplit(":", 1)[0] if ":" in name.rsplit("/", 1)[-1] else name
    raise ValueError(
        f"{value!r} is not pinned by digest: a tag (or no tag, which means :latest) can point at another image "
        f"tomorrow, and nodes that cached the old one keep running it. Pin it as {base}@sha256:<64 hex digits> "
        f"(`docker buildx imagetools inspect {name}` prints the digest)"
    )


Source = Annotated[str, Field(min_length=1, max_length=MAX_SOURCE_LENGTH)]
Revision = Annotated[str, Field(max_length=256)]
Nodes = Annotated[int, Field(ge=1, le=MAX_NODES)]
Parallel = Annotated[int, Field(ge=1, le=MAX_PARALLEL)]
Batch = Annotated[int, Field(ge=1, le=MAX_BATCH)]


class Tokenizer(StrictModel):
    source: Source
    revision: Revision


class Model(StrictModel):
    source: Source
    revision: Revision
    tokenizer: Tokenizer


class DataSource(StrictModel):
    source: Source
    revision: Revision


class Data(StrictModel):
    train: list[DataSource] = Field(min_length=1, max_length=1024)
    validation: list[DataSource] = Field(min_length=1, max_length=1024)


# GPU variants whose nodes have Grace (ARM) CPUs: their packages are linux/aarch64 builds.
ARM_VARIANTS = frozenset({"gh200", "gb200", "gb300"})
NodePlatform = Literal["x86_64", "aarch64"]


class Topology(StrictModel):
    num_nodes: Nodes
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    gpu_variant: str = Field(min_length=1, max_length=32, pattern=LABEL)
    node_platform: NodePlatform | None = Field(
        default=None,
        description="the nodes' CPU architecture (Linux); default: aarch64 for GH200/GB200/GB300, else x86_64",
    )

    @property
    def platform(self) -> NodePlatform:
        """The nodes' machine, which the lock's markers and wheels are judged for, not the submitting host's."""
        if self.node_platform is not None:
            return self.node_platform
        return "aarch64" if self.gpu_variant.lower() in ARM_VARIANTS else "x86_64"


class RolePlan(StrictModel):
    """Every field is explicit. `ref_num_nodes: 0` means the reference shares the policy's GPUs."""

    colocate_all: bool
    policy_num_nodes: Nodes
    policy_num_gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    ref_num_nodes: int = Field(ge=0, le=MAX_NODES)
    num_inference_engines: int = Field(ge=1, le=MAX_ENGINES)
    inference_engine_tensor_parallel_size: Parallel
    inference_engine_pipeline_parallel_size: Parallel
    inference_engine_data_parallel_size: Parallel
    inference_engine_expert_parallel_size: Parallel
    train_batch_size: Batch
    policy_mini_batch_size: Batch
    micro_train_batch_size_per_gpu: Batch
    n_samples_per_prompt: int = Field(ge=1, le=MAX_SAMPLES_PER_PROMPT)


class Retention(StrictModel):
    resume_checkpoint_count: int = Field(ge=1, le=5)
    temporary_storage_ttl_days: int = Field(ge=1, le=3650)


class JobSize(StrictModel):
    """What one export or eval job asks its scheduler for (Snakemake's own default is 1 CPU and 1000 MB).
    Placement: never part of an artifact's identity."""

    cpu: int = Field(2, ge=1, le=1024)
    memory: str = "4GB"

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str) -> str:
        return node_size(value)

    @property
    def mem_mb(self) -> int:
        return max(1, size_bytes(self.memory) // 10**6)


HUB_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
HUB_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# The license ids the Hub accepts in a card's metadata (huggingface.co/docs/hub/repositories-licenses, read
# 2026-12): the Hub refuses a card whose `license` is not one of them, so a typo here would fail the publish after
# training. A license the Hub has added since is written `other` until this list has it.
_HUB_LICENSE_IDS = """
apache-2.0 mit openrail bigscience-openrail-m creativeml-openrail-m bigscience-bloom-rail-1.0 bigcode-openrail-m
afl-3.0 artistic-2.0 bsl-1.0 bsd bsd-2-clause bsd-3-clause bsd-3-clause-clear c-uda cc cc0-1.0 cc-by-2.0
cc-by-2.5 cc-by-3.0 cc-by-4.0 cc-by-sa-3.0 cc-by-sa-4.0 cc-by-nc-2.0 cc-by-nc-3.0 cc-by-nc-4.0 cc-by-nd-4.0
cc-by-nc-nd-3.0 cc-by-nc-nd-4.0 cc-by-nc-sa-2.0 cc-by-nc-sa-3.0 cc-by-nc-sa-4.0 cdla-sharing-1.0
cdla-permissive-1.0 cdla-permissive-2.0 wtfpl ecl-2.0 epl-1.0 epl-2.0 etalab-2.0 eupl-1.1 agpl-3.0 gfdl gpl
gpl-2.0 gpl-3.0 lgpl lgpl-2.1 lgpl-3.0 isc lppl-1.3c ms-pl mpl-2.0 odc-by odbl openrail++ osl-3.0 postgresql
ofl-1.1 ncsa unlicense zlib pddl lgpl-lr deepfloyd-if-license llama2 llama3 llama3.1 llama3.2 llama3.3 gemma
unknown other
"""
HUB_LICENSES = frozenset(_HUB_LICENSE_IDS.split())


class Publish(StrictModel):
    """The optional publish stage: the export uploaded to a Hugging Face Hub model repo, tagged per version.
    Placement: never part of an artifact's identity. The token comes from HF_TOKEN in the environment only."""

    repo_id: str = Field(description="the Hub model repo, `<owner>/<name>`")
    private: bool = Field(True, description="create the repo private (an existing repo keeps its visibility)")
    revision_tag: str = Field("v{version}", max_length=128, description="the tag per version; `{version}` in it")

    @field_validator("repo_id")
    @classmethod
    def _repo_id(cls, value: str) -> str:
        if not HUB_REPO_ID.match(value) or ".." in value or value.endswith((".git", ".")):
            raise ValueError(
                f"{value!r} is not a Hub repo id; write `<owner>/<name>` (letters, digits, `.`, `_`, `-`), "
                "e.g. my-org/tiny-addition-grpo"
            )
        return value

    @field_validator("revision_tag")
    @classmethod
    def _tag(cls, value: str) -> str:
        example = value.replace("{version}", "2026.09.21")
        if "{version}" not in value or not HUB_TAG.match(example):
            raise ValueError(
                f"{value!r}: the tag must contain {{version}} (one tag per version) and otherwise only letters, "
                "digits, `.`, `_`, `-`; e.g. v{version}"
            )
        return value

    def tag(self, version: str) -> str:
        return self.revision_tag.replace("{version}", version)


MAX_ENV_VARIABLES = 256
MAX_ENV_VALUE = 4096


class ExecutionBase(StrictModel):
    """Where and how big the jobs are, beside each scheduler's own section (`Execution`). Placement: never part
    of an artifact's identity."""

    export: JobSize = Field(default_factory=JobSize, description="the export job's CPUs and memory")
    eval: JobSize = Field(default_factory=JobSize, description="the eval job's CPUs and memory")
    publish: Publish | None = Field(None, description="upload each version's export to the Hub (off when absent)")
    step_time_s: float | None = Field(
        None,
        gt=0,
        le=86_400,
        description="seconds a training step takes, for the plan's cost where no earlier run of this geometry "
        "measured one",
    )
    episode_stall_after_s: float = Field(
        720.0,
        gt=0,
        le=604_800,
        description="seconds a running agent train may play without an episode finishing before `rlbuild status` "
        "calls it stalled (sandboxes that stop answering, a provider that cannot start them)",
    )
    sandbox_caps: dict[SandboxBackend, Annotated[int, Field(ge=1, le=100_000)]] = Field(
        default_factory=dict,
        description="sandboxes a provider lets this experiment run at once ({backend: cap}, seed 003's is 6); "
        "recipe.environment.sandbox.max_concurrent must stay within its backend's cap",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_ENV_VARIABLES,
        description="plain (non-secret) environment variables for every task of the experiment's jobs",
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, value: Any) -> Any:
        """Names that may be set (rlbuild/core/wire.py); YAML integers (`NCCL_P2P_DISABLE: 1`) become their text."""
        if not isinstance(value, dict):
            return value
        problems = job_env_problems(value, tuple(p for cls in SCHEDULERS.values() for p in cls.variable_prefixes))
        for name, item in value.items():
            if isinstance(item, bool) or not isinstance(item, int | str):
                problems.append(f'{name}: {quote(item)} is not text; quote it (e.g. {name}: "1")')
            elif len(str(item)) > MAX_ENV_VALUE or "\0" in str(item):
                problems.append(f"{name}: the value is not an environment value (NUL, or over {MAX_ENV_VALUE} chars)")
        if problems:
            raise ValueError("; ".join(problems))
        return {name: str(item) for name, item in value.items()}


def _execution_model() -> type[ExecutionBase]:
    """`execution`: the fields above and one optional section per scheduler that takes settings (`execution.<name>`),
    validated by that scheduler's own model (rlbuild/schedulers/registry.py lists them)."""
    sections: dict[str, Any] = {
        name: (cls.settings_model | None, Field(None, description=f"placement on {cls.title}"))
        for name, cls in SCHEDULERS.items()
        if cls.settings_model is not None
    }
    return create_model("Execution", __base__=ExecutionBase, **sections)


Execution = _execution_model()


def scheduler_settings(execution: ExecutionBase) -> dict[str, Any]:
    """The scheduler sections the experiment sets, by scheduler name."""
    return {name: value for name in SCHEDULERS if (value := getattr(execution, name, None)) is not None}


class Experiment(StrictModel):
    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH)
    seed: int = Field(ge=0, le=MAX_SEED)
    runtime: Runtime
    model: Model
    data: Data
    topology: Topology
    role_plan: RolePlan
    retention: Retention
    recipe: dict[str, Any] = Field(default_factory=dict)
    execution: Execution = Field(default_factory=Execution)  # type: ignore[valid-type]
    # It describes the export, it does not make it: not identity-bearing (a completed version keeps the card it
    # was exported with; `snakemake --forcerun export` writes the new one).
    license: str = Field(
        DEFAULT_LICENSE,
        max_length=64,
        description=f"the exported model's license, a Hub license id (e.g. apache-2.0, mit) in its card; default "
        f"{DEFAULT_LICENSE!r}: the card says the base model's and the data's terms apply",
    )
    arms: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        max_length=MAX_ARMS,
        description="a series: arm name -> overlay of this experiment (deep-merged), each built as a whole experiment "
        "under the version key <version>@<arm> (rlbuild/plan/series.py)",
    )

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, protected_namespaces=())

    @field_validator("license")
    @classmethod
    def _license(cls, value: str) -> str:
        if value not in HUB_LICENSES:
            close = difflib.get_close_matches(value.lower(), HUB_LICENSES, n=3, cutoff=0.5)
            suggestion = f"did you mean {' or '.join(close)}? " if close else ""
            raise ValueError(
                f"{quote(value)} is not a Hub license id ({suggestion}e.g. apache-2.0, mit, llama3.1; the Hub refuses "
                f"a card with any other); a license the Hub does not list is {DEFAULT_LICENSE!r} (the default): the "
                "card then says the base model's and the data's terms apply"
            )
        return value

    @field_validator("arms")
    @classmethod
    def _arms(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        problems = []
        for name, overlay in value.items():
            if len(name) > MAX_ARM_NAME_LENGTH or not ARM_NAME.fullmatch(name):
                problems.append(
                    f"arm {name!r} is not an arm name: use lower-case letters, digits, '_' and '-' (at most "
                    f"{MAX_ARM_NAME_LENGTH}); it ends the arm's version key, e.g. 2026.09.21@{_slug(name)}"
                )
            problems += [
                f"arm {name!r} sets {key!r}, which every arm shares; remove it"
                for key in NOT_OVERLAID
                if key in overlay
            ]
            if "smoke" in overlay and not isinstance(overlay["smoke"], bool):
                problems.append(f"arm {name!r}: smoke is {overlay['smoke']!r}; write smoke: true or leave it out")
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value) or ".." in value:
            raise ValueError(
                f"{value!r} is not a path segment; use lower-case letters, digits, '.', '_' and '-' "
                "(it names the experiment's folder in storage)"
            )
        return value


@dataclass(frozen=True)
class NodeLimits:
    """The largest node a cluster offers, where a profile declares it (None: not declared, not checked)."""

    cpu: float | None
    memory: str | None
    disk: str | None


def check_node_sizes(experiment: Experiment, limits: NodeLimits) -> list[Violation]:
    """Every per-node size the experiment asks for fits the largest node the profile declares."""
    execution = experiment.execution
    asked: list[tuple[str, str, float | str | None]] = [
        ("execution.export.cpu", "cpu", execution.export.cpu),
        ("execution.export.memory", "memory", execution.export.memory),
        ("execution.eval.cpu", "cpu", execution.eval.cpu),
        ("execution.eval.memory", "memory", execution.eval.memory),
    ]
    for name, settings in scheduler_settings(execution).items():
        asked += [(size.field, size.kind, size.value) for size in SCHEDULERS[name].node_sizes(settings)]
    out: list[Violation] = []
    for field, kind, value in asked:
        limit = getattr(limits, kind)
        if value is None or limit is None:
            continue
        too_big = value > limit if kind == "cpu" else size_bytes(str(value)) > size_bytes(str(limit))
        if too_big:
            out.append(
                Violation(
                    field,
                    f"asks for {value} but the largest node the profile declares has {kind} {limit}",
                    f"ask for at most {limit} (config node_{kind}), or use a cluster with larger nodes",
                )
            )
    return out


def check_version(version: str) -> list[Violation]:
    """A version is `dev` or a real calendar date YYYY.MM.DD with an optional .N (N up to 9999)."""
    if version == MUTABLE_VERSION:
        return []
    fix = "use YYYY.MM.DD or YYYY.MM.DD.N for an immutable run (e.g. 2026.09.21), or 'dev' while iterating"
    match = CALENDAR_VERSION.fullmatch(version)
    if not match:
        odd = "" if version.isascii() else " (it holds characters beyond ASCII, such as full-width digits)"
        return [Violation("version", f"{quote(version, 40)} is not a calendar version{odd}", fix)]
    try:
        date(int(match[1]), int(match[2]), int(match[3]))
    except ValueError as exc:
        return [Violation("version", f"{version!r} is not a date ({exc})", fix)]
    return []


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9_-]+", "-", name.lower()).strip("-") or "arm-1"
