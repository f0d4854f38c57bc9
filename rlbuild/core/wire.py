"""The job wire contract: what a job may receive from the submitting environment, the variables rlbuild sets for
it, and the exit codes a job answers with.

One place for the rules every executor applies: which variables travel to a job, which never do,
which names hold secrets (redacted wherever text is shown), the ports a gang task asks for, and the names and
codes the submitting side and the node side (the gang, the chain, the trainer) read from each other.
Dependency-free on purpose: executor plugins import it on every Snakemake start.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, MutableMapping

# Names whose values are secrets: never printed, never in a record or a plan.
SECRET_NAME = re.compile(r"(secret|token(?!izer)|password|passwd|api[_-]?key|access[_-]?key|credential)", re.IGNORECASE)

# Forwarded from the submitter when set (scheduler tasks do not inherit its environment).
FORWARDED = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_ENDPOINT",
    "HF_HUB_OFFLINE",
    "WANDB_API_KEY",
    "WANDB_ENTITY",
    "WANDB_PROJECT",
    "WANDB_BASE_URL",
    "WANDB_MODE",
    "DAYTONA_API_KEY",
    "DAYTONA_API_URL",
    "DAYTONA_TARGET",
    "MODAL_TOKEN_ID",
    "MODAL_TOKEN_SECRET",
    "E2B_API_KEY",
)
FORWARDED_PREFIXES = ("RLBUILD_", "SNAKEMAKE_STORAGE_S3_")
# The cluster injects its own storage credentials; forwarding these would clobber them (seed 003).
NEVER_FORWARDED = re.compile(r"^(AWS_|R2_)")

# `--config allow_retrain=true` reaches the train job as this variable (a rule param would be provenance).
ALLOW_RETRAIN = "RLBUILD_ALLOW_RETRAIN"
# Epoch seconds at which the trainer checkpoints and exits CONTINUE_EXIT_CODE (set by a chain of jobs that
# crosses wall-clock limits).
STOP_AT_ENV = "RLBUILD_STOP_AT"
# The folder a trainer's local Ray keeps its session in, made and removed by `rlbuild train` (the supervisor
# removes it whatever ended the trainer, SIGKILL included: rlbuild/job/interrupts.py).
RAY_TEMP_DIR_ENV = "RLBUILD_RAY_TEMP_DIR"

# Exit codes a job answers with, read by the side that started it.
CONTINUE_EXIT_CODE = 75  # EX_TEMPFAIL: trained up to a checkpoint before the limit; the next link resumes
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as a shell reports an interrupted command
NOT_RETRYABLE_EXIT_CODE = 3  # the gang met a failure a retry would meet again (the runtime digest mismatch)

# The Ray custom resource each gang rank's node carries, so the trainer pins layout node i to rank i.
RANK_RESOURCE = "rlbuild_rank_{rank}"

# Each gang task asks its scheduler for one port per name, so several Ray nodes can
# share a host.
RAY_PORT_NAMES = (
    "ray_gcs",
    "ray_node_manager",
    "ray_object_manager",
    "ray_metrics",
    "ray_agent_listen",
    "ray_agent_grpc",
    "ray_runtime_env",
    "ray_client",
)


# Under a scheduler whose jobs get the submitting process's environment, that environment is cut to the allow-list
# plus what a process needs to run (no secrets among them) and the scheduler's own variables.
PROCESS_BASICS = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR")
PROCESS_BASICS += ("VIRTUAL_ENV", "PYTHONPATH", "HF_HOME")
PROCESS_PREFIXES = ("LC_", "XDG_")


# `execution.env`: plain variables an experiment sets for its jobs' tasks (seed 003's extra_env).
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# Set by rlbuild, Snakemake or Ray themselves (and each scheduler's own, `Scheduler.variable_prefixes`): an
# experiment setting one would fight them.
RESERVED_PREFIXES = ("RLBUILD_", "SNAKEMAKE_", "RAY_")
# Of these variables, the ones that change what a run computes (reduction order, precision, kernels), not only how
# fast or where it runs: they enter the launch identity; every other `execution.env` variable is placement.
NUMERIC_ENV = (
    "NCCL_ALGO",
    "NCCL_PROTO",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_USE_V1",
)


def job_env_problems(env: Mapping[str, str], scheduler_prefixes: tuple[str, ...] = ()) -> list[str]:
    """Why each `execution.env` name cannot be set for a job, one sentence per name (empty: all can);
    `scheduler_prefixes`: the variables the schedulers set in their tasks."""
    problems = []
    for name in env:
        if not ENV_NAME.match(name):
            problems.append(f"{name!r} is not an environment variable name (letters, digits, _; not a digit first)")
        elif is_secret_name(name) or name in FORWARDED:
            problems.append(
                f"{name} looks like a secret: secrets stay in the submitting environment and reach jobs through the "
                "allow-list (rlbuild/core/wire.py), never through an experiment file, a plan or a record"
            )
        elif NEVER_FORWARDED.match(name):
            problems.append(f"{name}: AWS_*/R2_* never reach a job; the cluster injects its own storage credentials")
        elif name.startswith(RESERVED_PREFIXES + scheduler_prefixes) or name in PROCESS_BASICS:
            problems.append(f"{name} is set by rlbuild, Snakemake, the scheduler or the node itself; leave it to them")
    return problems


def numeric_env(env: Mapping[str, str]) -> dict[str, str]:
    """The `execution.env` variables that change numerics (they enter the launch identity)."""
    return {name: value for name, value in sorted(env.items()) if name in NUMERIC_ENV}


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def refused_names(names: list[str]) -> list[str]:
    """The names that must never reach a job (AWS_*, R2_*)."""
    return [name for name in names if NEVER_FORWARDED.match(name)]


def forwarded(environ: Mapping[str, str], extra: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The submitter's variables a job receives: the allow-list, the allowed prefixes and `extra` names, when set.

    Callers refuse `refused_names(extra)` first; AWS_*/R2_* never match the allow-list.
    """
    env = {k: v for k, v in environ.items() if k.startswith(FORWARDED_PREFIXES)}
    env |= {k: environ[k] for k in [*FORWARDED, *extra] if environ.get(k) and not NEVER_FORWARDED.match(k)}
    return env


def restrict_to_forwarded(
    environ: MutableMapping[str, str], job_env: Collection[str] = (), scheduler_prefixes: tuple[str, ...] = ()
) -> list[str]:
    """Remove from `environ` every variable a job must not receive; return the names removed (never values).

    What stays is `forwarded(environ)`, the process basics (PATH, HOME, locale...), the scheduler's own settings
    (`scheduler_prefixes`) and the experiment's `execution.env` names (`job_env`, checked by `job_env_problems`).
    """
    kept_prefixes = PROCESS_PREFIXES + scheduler_prefixes
    keep = set(forwarded(environ)) | {n for n in environ if n in PROCESS_BASICS or n.startswith(kept_prefixes)}
    keep |= {n for n in job_env if n in environ}
    removed = sorted(name for name in environ if name not in keep or NEVER_FORWARDED.match(name))
    for name in removed:
        del environ[name]
    return removed
