"""The experiment file (`config/experiments/<name>.yaml`) as pydantic models.

Field names are the user-facing contract. Unknown keys are errors with a "did you mean".
Structural problems (types, unknown keys, missing fields) are collected all at once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt, ValidationError, field_validator

from rlbuild.errors import PreflightError, Violation
from rlbuild.validation import violations

VERSION_PATTERN = re.compile(r"^(\d{4}\.\d{2}\.\d{2}(\.\d+)?|dev)$")
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
SIZE_PATTERN = re.compile(r"^(\d+(\.\d+)?)\s*(KB|MB|GB|TB|KiB|MiB|GiB|TiB)$")
SIZE_MB = {"KB": 1e-3, "MB": 1.0, "GB": 1e3, "TB": 1e6}
SIZE_MB |= {unit: 1024**power / 1e6 for power, unit in enumerate(["KiB", "MiB", "GiB", "TiB"], 1)}


def check_size(value: str) -> str:
    if not SIZE_PATTERN.match(value.strip()):
        raise ValueError(f"{value!r} is not a size; write it like '512GB' or '64GiB'")
    return value.strip()


def size_mb(value: str) -> int:
    """A checked size in megabytes (1GB = 1000MB; 1GiB = 1073.7MB)."""
    number, _, unit = SIZE_PATTERN.match(value.strip()).groups()  # type: ignore[union-attr]
    return int(float(number) * SIZE_MB[unit])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Runtime(_Strict):
    entrypoint: Literal["grpo", "fully_async"]
    strategy: Literal["fsdp2", "megatron"]


class Tokenizer(_Strict):
    source: str
    revision: str


class Model(_Strict):
    source: str
    revision: str
    tokenizer: Tokenizer


class DataSource(_Strict):
    source: str
    revision: str


class Data(_Strict):
    train: list[DataSource] = Field(min_length=1)
    validation: list[DataSource] = Field(min_length=1)


class Topology(_Strict):
    num_nodes: PositiveInt
    gpus_per_node: PositiveInt
    gpu_variant: str = Field(min_length=1)


class RolePlan(_Strict):
    """Every field is explicit. `ref_num_nodes: 0` means the reference shares the policy's GPUs."""

    colocate_all: bool
    policy_num_nodes: PositiveInt
    policy_num_gpus_per_node: PositiveInt
    ref_num_nodes: NonNegativeInt
    num_inference_engines: PositiveInt
    inference_engine_tensor_parallel_size: PositiveInt
    inference_engine_pipeline_parallel_size: PositiveInt
    inference_engine_data_parallel_size: PositiveInt
    inference_engine_expert_parallel_size: PositiveInt
    train_batch_size: PositiveInt
    policy_mini_batch_size: PositiveInt
    micro_train_batch_size_per_gpu: PositiveInt
    n_samples_per_prompt: PositiveInt


class Retention(_Strict):
    resume_checkpoint_count: int = Field(ge=1, le=5)
    temporary_storage_ttl_days: PositiveInt


class IrisExecution(_Strict):
    """Placement on Iris. Never part of an artifact's identity."""

    cluster: str = Field(min_length=1)
    cpu: float = Field(gt=0)
    memory: str
    disk: str
    priority: Literal["production", "interactive", "batch"] = "interactive"
    max_retries: NonNegativeInt = 1

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)

    @field_validator("memory", "disk")
    @classmethod
    def _size(cls, value: str) -> str:
        return check_size(value)


TIME_LIMIT_PATTERN = re.compile(r"^(?:(\d+)-)?(\d+):(\d{2}):(\d{2})$")


def time_limit_seconds(text: str) -> int:
    """Slurm's `[D-]HH:MM:SS` as seconds (the form `sbatch --time` and `sinfo` print)."""
    match = TIME_LIMIT_PATTERN.match(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a Slurm time limit; write it like '11:59:00' or '1-00:00:00'")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class SlurmExecution(_Strict):
    """Placement on Slurm. Never part of an artifact's identity.

    `account` and `partition` are checked by preflight (not required here) so that every Slurm problem of an
    experiment is reported in one pass, with the others.
    """

    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    time_limit: str = Field(description="wall-clock limit of one link of the train chain, [D-]HH:MM:SS")
    max_links: PositiveInt = Field(default=4, description="jobs a train chain may take before it fails")
    signal_lead_s: PositiveInt = Field(
        default=300, description="seconds before the limit at which training checkpoints and hands over"
    )
    step_time_s: float | None = Field(default=None, gt=0, description="expected seconds per training step")
    cpus_per_node: PositiveInt | None = None
    memory_per_node: str | None = None

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, value: str) -> str:
        if time_limit_seconds(value) < 60:
            raise ValueError(f"{value!r} is under a minute, Slurm's smallest time limit")
        return value.strip()

    @field_validator("memory_per_node")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        return None if value is None else check_size(value)

    @property
    def time_limit_s(self) -> int:
        return time_limit_seconds(self.time_limit)


class Execution(_Strict):
    iris: IrisExecution | None = None
    slurm: SlurmExecution | None = None


class Experiment(_Strict):
    name: str
    seed: NonNegativeInt
    runtime: Runtime
    model: Model
    data: Data
    topology: Topology
    role_plan: RolePlan
    retention: Retention
    recipe: dict[str, Any] = Field(default_factory=dict)
    execution: Execution = Field(default_factory=Execution)

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, protected_namespaces=())

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_PATTERN.match(value) or ".." in value:
            raise ValueError(
                f"{value!r} is not a path segment; use lower-case letters, digits, '.', '_' and '-' "
                "(it names the experiment's folder in storage)"
            )
        return value


def parse_experiment(raw: Any, source: str) -> Experiment:
    """Validate a parsed experiment mapping; raise PreflightError listing every structural problem."""
    if not isinstance(raw, dict):
        raise PreflightError(source, [Violation("<root>", "must be a mapping of the experiment's fields")])
    try:
        return Experiment.model_validate(raw)
    except ValidationError as exc:
        found = violations(exc, raw, Experiment)
    raise PreflightError(source, found + _arithmetic_of_parts(raw))


def _arithmetic_of_parts(raw: dict[str, Any]) -> list[Violation]:
    """Role-plan arithmetic of the sections that did parse, so one run reports every problem."""
    from rlbuild.roleplan import check_role_plan

    try:
        topology = Topology.model_validate(raw.get("topology"))
        plan = RolePlan.model_validate(raw.get("role_plan"))
        runtime = Runtime.model_validate(raw.get("runtime"))
    except ValidationError:
        return []
    return check_role_plan(topology, plan, runtime)


def load_experiment(path: Path) -> Experiment:
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise PreflightError(
            str(path), [Violation("experiment", "file not found", "create it or pick one in config/experiments/")]
        ) from None
    except yaml.YAMLError as exc:
        raise PreflightError(str(path), [Violation("<file>", f"is not valid YAML: {exc}")]) from None
    return parse_experiment(raw, str(path))


def check_version(version: str) -> list[Violation]:
    if VERSION_PATTERN.match(version):
        return []
    return [
        Violation(
            "version",
            f"{version!r} is not a calendar version",
            "use YYYY.MM.DD or YYYY.MM.DD.N for an immutable run (e.g. 2026.09.21), or 'dev' while iterating",
        )
    ]
