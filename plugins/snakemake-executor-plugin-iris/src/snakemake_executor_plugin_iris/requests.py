"""What a Snakemake job asks of Iris: pure functions from rule resources and settings, testable without Iris."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlbuild.core.wire import forwarded, refused_names
from rlbuild.schedulers.iris.client import Placement
from snakemake_executor_plugin_iris.errors import IrisSettingError

PRIORITIES = ("production", "interactive", "batch")
ON_INTERRUPT = ("keep", "cancel")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SIZE = re.compile(r"^\s*\d+(\.\d+)?\s*([KMGTP]i?B?)?\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Defaults:
    """Plugin settings that apply when a rule does not declare its own `iris_*` resource."""

    cpu: float
    memory: str
    disk: str
    priority: str
    max_retries: int
    coschedule: str


def _int(resources: Mapping[str, object], key: str, default: int) -> int:
    value = resources.get(key, default)
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise IrisSettingError(f"resources.{key}", value, "declare an integer") from None


def _size(field: str, value: object) -> str:
    text = str(value)
    if not _SIZE.match(text):
        raise IrisSettingError(field, value, "give a size such as '512GB' or '8GiB'")
    return text.replace(" ", "")


def priority(field: str, value: object) -> str:
    text = str(value).lower()
    if text not in PRIORITIES:
        raise IrisSettingError(field, value, f"choose one of {', '.join(PRIORITIES)}")
    return text


def placement(resources: Mapping[str, object], threads: int, defaults: Defaults) -> Placement:
    """A gang when the rule declares `gpu_nodes` >= 1 with `gpus_per_node` > 0: one whole-node task per node,
    co-scheduled. Otherwise one task sized from `iris_*` resources, else the job's threads/mem_mb/disk_mb."""
    nodes = _int(resources, "gpu_nodes", 0)
    gpus = _int(resources, "gpus_per_node", 0)
    gang = "gpu_nodes" in resources and nodes >= 1 and gpus > 0
    if "gpu_nodes" in resources and not gang:
        raise IrisSettingError(
            "resources.gpu_nodes/gpus_per_node", (nodes, gpus), "a gang needs gpu_nodes >= 1 and gpus_per_node > 0"
        )
    variant = str(resources.get("gpu_variant", "")) if gang else ""
    if gang and not variant:
        raise IrisSettingError("resources.gpu_variant", variant, "declare the GPU variant, e.g. 'H100'")
    if gang:
        cpu = float(resources.get("iris_cpu", defaults.cpu))  # type: ignore[arg-type]
        memory = _size("resources.iris_memory", resources.get("iris_memory", defaults.memory))
        disk = _size("resources.iris_disk", resources.get("iris_disk", defaults.disk))
    else:
        cpu = float(resources.get("iris_cpu", max(threads, 1)))  # type: ignore[arg-type]
        memory = _size("resources.iris_memory", resources.get("iris_memory", f"{resources.get('mem_mb', 1000)}MB"))
        disk = _size("resources.iris_disk", resources.get("iris_disk", f"{resources.get('disk_mb', 1000)}MB"))
    retries = _int(resources, "iris_max_retries", defaults.max_retries)
    if retries < 0:
        raise IrisSettingError("resources.iris_max_retries", retries, "use 0 or more")
    return Placement(
        replicas=nodes if gang else 1,
        cpu=cpu,
        memory=memory,
        disk=disk,
        # A "cpu" variant (the CPU-only embedded default) is a gang of plain nodes: no device request.
        gpu_variant=None if not gang or variant.lower() == "cpu" else variant,
        gpus_per_node=gpus if gang else 0,
        priority=priority("resources.iris_priority", resources.get("iris_priority", defaults.priority)),
        max_retries=retries,
        coschedule=defaults.coschedule if gang and nodes > 1 else None,
        is_gang=gang,
    )


def runtime_image(resources: Mapping[str, object]) -> str | None:
    """The container image the job's nodes run (`iris_image`: the experiment's runtime.image), if any."""
    return str(resources["iris_image"]) if resources.get("iris_image") else None


def runtime_extras(resources: Mapping[str, object]) -> tuple[str, ...]:
    """The extras Iris's set-up of the bundle installs (`iris_extras`: `gpu` on GPU topologies, `harbor` where Harbor
    plays the episodes)."""
    return tuple(n for n in re.split(r"[,\s]+", str(resources.get("iris_extras") or "")) if n)


def task_env(environ: Mapping[str, str], declared: Mapping[str, str], extra: list[str]) -> dict[str, str]:
    """The environment handed to Iris: Snakemake's declared variables (storage settings, --envvars), the allow-list
    and `extra` names, when set. AWS_* / R2_* are refused: the cluster injects its own storage credentials."""
    for name in refused_names([*declared, *extra]):
        raise IrisSettingError(
            "environment variable", name, "do not forward AWS_*/R2_*; the cluster injects storage credentials"
        )
    return forwarded(environ, extra) | {k: v for k, v in declared.items() if v}


def gang_command(
    python: str,
    nodes: int,
    gang_id: str,
    step: str,
    launch: str | None,
    rendezvous_root: str | None,
    join_timeout_s: int,
) -> str:
    """Every task of the gang runs the bootstrap; rank 0 runs `step` (the Snakemake job) once Ray is up."""
    argv = [python, "-m", "rlbuild.schedulers.gangtask", "--nodes", str(nodes), "--gang-id", gang_id]
    argv += ["--join-timeout", str(join_timeout_s)]
    if launch:
        argv += ["--launch", launch]
    if rendezvous_root:
        argv += ["--rendezvous-root", rendezvous_root]
    return " ".join(shlex.quote(a) for a in [*argv, "--", "bash", "-c", step])


def setting_problems(settings: Any) -> list[str]:
    """Every plugin setting that cannot work, as `--iris-<name>=<value>: <fix>` (ExecutorSettings.__post_init__)."""
    problems = []
    for name in ("node_memory", "node_disk"):
        if not _SIZE.match(str(getattr(settings, name))):
            problems.append(f"--iris-{name.replace('_', '-')}={getattr(settings, name)!r}: give a size such as '512GB'")
    for name in ("node_cpu", "scheduling_timeout", "join_timeout", "log_tail"):
        if not getattr(settings, name) > 0:
            problems.append(f"--iris-{name.replace('_', '-')}={getattr(settings, name)!r}: must be greater than 0")
    if settings.max_retries < 0:
        problems.append(f"--iris-max-retries={settings.max_retries!r}: use 0 or more")
    if str(settings.priority).lower() not in PRIORITIES:
        problems.append(f"--iris-priority={settings.priority!r}: choose one of {', '.join(PRIORITIES)}")
    if settings.on_interrupt not in ON_INTERRUPT:
        problems.append(f"--iris-on-interrupt={settings.on_interrupt!r}: choose one of {', '.join(ON_INTERRUPT)}")
    rules = [n for n in re.split(r"[,\s]+", settings.rules or "") if n]
    bad_rules = [n for n in rules if not _NAME.match(n)]
    if bad_rules or (settings.rules is not None and not rules):
        problems.append(f"--iris-rules={settings.rules!r}: give comma-separated rule names, e.g. train,export,eval")
    names = [n for n in re.split(r"[,\s]+", settings.env or "") if n]
    bad = [n for n in names if not _NAME.match(n)] + refused_names(names)
    if bad:
        problems.append(
            f"--iris-env names {bad}: give environment variable names; AWS_*/R2_* are never forwarded "
            "(the cluster injects storage credentials)"
        )
    return problems
