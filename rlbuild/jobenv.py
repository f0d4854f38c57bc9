"""What a job may receive from the submitting environment, and what the gang's Ray needs from its scheduler.

One place for the rules every executor applies (Iris, Slurm): which variables travel to a job, which never do,
which names hold secrets (redacted wherever text is shown), and the ports a gang task asks for.
Dependency-free on purpose: executor plugins import it on every Snakemake start.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping

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
)
FORWARDED_PREFIXES = ("RLBUILD_", "SNAKEMAKE_STORAGE_S3_")
# The cluster injects its own storage credentials; forwarding these would clobber them (seed 003).
NEVER_FORWARDED = re.compile(r"^(AWS_|R2_)")

# `--config allow_retrain=true` reaches the train job as this variable (a rule param would be provenance).
ALLOW_RETRAIN = "RLBUILD_ALLOW_RETRAIN"

# Each gang task asks its scheduler for one port per name (Iris: IRIS_PORT_<NAME>), so several Ray nodes can
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


# The official Slurm plugin submits with `sbatch --export=ALL`: a job gets the submitting process's environment.
# Under Slurm that environment is cut to the allow-list plus what a process needs to run (no secrets among them).
PROCESS_BASICS = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR")
PROCESS_BASICS += ("VIRTUAL_ENV", "PYTHONPATH", "HF_HOME")
PROCESS_PREFIXES = ("LC_", "XDG_", "SLURM_", "SBATCH_", "SRUN_", "SALLOC_")


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


def restrict_to_forwarded(environ: MutableMapping[str, str]) -> list[str]:
    """Remove from `environ` every variable a job must not receive; return the names removed (never values).

    What stays is `forwarded(environ)` and the process basics (PATH, HOME, locale, Slurm's own settings...).
    """
    keep = set(forwarded(environ)) | {n for n in environ if n in PROCESS_BASICS or n.startswith(PROCESS_PREFIXES)}
    removed = sorted(name for name in environ if name not in keep or NEVER_FORWARDED.match(name))
    for name in removed:
        del environ[name]
    return removed
