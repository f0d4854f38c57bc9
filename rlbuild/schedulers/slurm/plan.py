"""What the plan asks of Slurm: the experiment's `execution.slurm` settings, what a job asks of Slurm through the
official executor plugin, what preflight asks of Slurm itself, and Slurm's lines in the plan.

The plugin (`snakemake-executor-plugin-slurm`) submits every job with `sbatch` and reads rule resources:
`slurm_account`, `slurm_partition`, `qos`, `runtime` (minutes), `nodes`, `gres`, `cpus_per_task`, `mem_mb`,
`slurm_extra`, `tasks`, and `mpi`. The train job is one Slurm job of whole nodes, one task per node, requeueable,
warned `signal_lead_s` before its limit. Its job step must run the Snakemake job in the batch step (not under
`srun -n1`), so that `rlbuild train` can start the gang on every node itself (chain.py): the job step
(slurm-jobstep 0.6) does so for any job that declares `mpi`. The value is empty on purpose: the submitting side
(2.8) treats a non-empty `mpi` as an MPI job, which it refuses for one task per node (it wants `tasks` > 1).

Dependency-light on purpose: it runs while Snakemake builds the DAG.
"""

from __future__ import annotations

import functools
import math
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, field_validator

from rlbuild.contracts.launch import CPU_VARIANT
from rlbuild.contracts.runtime import REPO_ROOT
from rlbuild.core.errors import Violation
from rlbuild.core.validation import LABEL, StrictModel, node_size, size_bytes
from rlbuild.schedulers.base import Gang, NodeSize, PlanFacts

SINFO_TIMEOUT_S = 5.0
SECTION = "execution.slurm"
_GPUS = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


TIME_LIMIT_PATTERN = re.compile(r"(?:(\d{1,3})-)?(\d{1,4}):(\d{2}):(\d{2})", re.ASCII)
MAX_TIME_LIMIT_S = 365 * 86400


def time_limit_seconds(text: str) -> int:
    """Slurm's `[D-]HH:MM:SS` as seconds (the form `sbatch --time` and `sinfo` print)."""
    match = TIME_LIMIT_PATTERN.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a Slurm time limit; write it like '11:59:00' or '1-00:00:00'")
    days, hours, minutes, seconds = (int(g or 0) for g in match.groups())
    if minutes > 59 or seconds > 59:
        raise ValueError(f"{text!r} has more than 59 minutes or seconds; write it like '11:59:00' or '1-00:00:00'")
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


class SlurmSettings(StrictModel):
    """The experiment's `execution.slurm`: where its Slurm jobs run and how a train chain crosses their wall-clock
    limits. Placement: never part of an artifact's identity.

    `account` and `partition` are checked by preflight (not required here) so that every Slurm problem of an
    experiment is reported in one pass, with the others.
    """

    account: str | None = Field(default=None, max_length=63, pattern=LABEL)
    partition: str | None = Field(default=None, max_length=63, pattern=LABEL)
    qos: str | None = Field(default=None, max_length=63, pattern=LABEL)
    time_limit: str = Field(description="wall-clock limit of one link of the train chain, [D-]HH:MM:SS")
    max_links: int = Field(default=4, ge=1, le=1000, description="jobs a train chain may take before it fails")
    signal_lead_s: int = Field(
        default=300, ge=1, le=86400, description="seconds before the limit at which training checkpoints and hands over"
    )
    step_time_s: float | None = Field(default=None, gt=0, le=86400, description="expected seconds per training step")
    cpus_per_node: int | None = Field(default=None, ge=1, le=4096)
    memory_per_node: str | None = None

    model_config = ConfigDict(extra="forbid", strict=False, frozen=True)

    @field_validator("time_limit")
    @classmethod
    def _time_limit(cls, value: str) -> str:
        if not 60 <= time_limit_seconds(value) <= MAX_TIME_LIMIT_S:
            raise ValueError(f"{value!r} is not a link's time limit; give at least a minute and at most 365 days")
        return value.strip()

    @field_validator("memory_per_node")
    @classmethod
    def _memory(cls, value: str | None) -> str | None:
        return None if value is None else node_size(value)

    @property
    def time_limit_s(self) -> int:
        return time_limit_seconds(self.time_limit)


# The resources below that only Slurm's executors read (the others, chain_*, mem_mb, cpus_per_task, runtime, are
# read by the rule's command or by other executors too).
SLURM_ONLY = frozenset({"slurm_account", "slurm_partition", "qos", "slurm_extra", "mpi", "gres", "tasks", "nodes"})


def gang_resources(slurm: SlurmSettings, gang: Gang) -> dict[str, int | str]:
    """Rule resources of the train gang; the chain settings (`chain_*`) are read by the rule's command."""
    extra = ["--exclusive", "--ntasks-per-node=1", "--requeue", "--open-mode=append"]
    extra.append(f"--signal=USR1@{slurm.signal_lead_s}")
    resources: dict[str, int | str] = {
        **cluster_resources(slurm),
        "runtime": math.ceil(slurm.time_limit_s / 60),
        "nodes": gang.num_nodes,
        "mpi": "",  # present: the batch step runs the job; empty: not an MPI job to the submitter
        "slurm_extra": " ".join(extra),
        # No --mem unless stated: an exclusive job then gets the partition's default, usually the whole node.
        "mem_mb": size_bytes(slurm.memory_per_node) // 10**6 if slurm.memory_per_node else 0,
        "chain_max_links": slurm.max_links,
        "chain_signal_lead_s": slurm.signal_lead_s,
    }
    if gang.gpu_variant.lower() != CPU_VARIANT:
        resources["gres"] = f"gpu:{gang.gpus_per_node}"
    else:  # without GPUs the plugin asks for --ntasks (default 1, which would shrink the job to one node)
        resources["tasks"] = gang.num_nodes
    if slurm.cpus_per_node:
        resources["cpus_per_task"] = slurm.cpus_per_node
    return resources


def cluster_resources(slurm: SlurmSettings) -> dict[str, int | str]:
    """Account, partition and QoS of every job the experiment sends to Slurm."""
    named = {"slurm_account": slurm.account, "slurm_partition": slurm.partition, "qos": slurm.qos}
    return {key: value for key, value in named.items() if value}


def node_sizes(slurm: SlurmSettings) -> list[NodeSize]:
    sizes = [NodeSize(f"{SECTION}.cpus_per_node", "cpu", slurm.cpus_per_node)] if slurm.cpus_per_node else []
    if slurm.memory_per_node:
        sizes.append(NodeSize(f"{SECTION}.memory_per_node", "memory", slurm.memory_per_node))
    return sizes


def usable_seconds(slurm: SlurmSettings) -> int:
    """Seconds of training one link holds: its limit less the lead at which it hands over."""
    return slurm.time_limit_s - slurm.signal_lead_s


def expected_links(slurm: SlurmSettings, max_steps: int, step_time_s: float | None) -> int | None:
    """Jobs the chain is expected to take (start-up time aside), or None without a step time."""
    if step_time_s is None or usable_seconds(slurm) <= 0:
        return None
    return max(1, math.ceil(max_steps * step_time_s / usable_seconds(slurm)))


def check_chain(slurm: SlurmSettings, max_steps: int, ckpt_interval: int, step_time_s: float | None) -> list[Violation]:
    """Account and partition set; the lead inside the limit; with a step time, one checkpoint interval and the
    whole run (in at most max_links links) fitting the limit."""
    out = [
        Violation(f"{SECTION}.{name}", "is not set", f"name the Slurm {what} the jobs are charged to / run in")
        for name, what in (("account", "account"), ("partition", "partition"))
        if not getattr(slurm, name)
    ]
    if usable_seconds(slurm) <= 0:
        out.append(
            Violation(
                f"{SECTION}.signal_lead_s",
                f"{slurm.signal_lead_s} s is not shorter than time_limit {slurm.time_limit} ({slurm.time_limit_s} s)",
                "give the warning well inside the limit (minutes on a 12 h limit)",
            )
        )
    if step_time_s is None or usable_seconds(slurm) <= 0:
        return out
    if slurm.signal_lead_s < step_time_s:
        out.append(
            Violation(
                f"{SECTION}.signal_lead_s",
                f"{slurm.signal_lead_s} s is shorter than one step (~{step_time_s:.0f} s): the step under way cannot "
                "finish and checkpoint before Slurm kills the job",
                f"raise it above {math.ceil(step_time_s * 2)} s (a step and its checkpoint)",
            )
        )
    interval = min(ckpt_interval, max_steps)  # the last step is always checkpointed
    if interval * step_time_s > usable_seconds(slurm):
        out.append(
            Violation(
                f"{SECTION}.time_limit",
                f"{slurm.time_limit} less the {slurm.signal_lead_s} s lead holds {usable_seconds(slurm)} s, under one "
                f"checkpoint interval ({interval} steps x ~{step_time_s:g} s = {interval * step_time_s:.0f} s)",
                "raise the time limit, or lower trainer.ckpt_interval in the recipe",
            )
        )
    links = expected_links(slurm, max_steps, step_time_s)
    if links is not None and links > slurm.max_links:
        out.append(
            Violation(
                f"{SECTION}.max_links",
                f"{slurm.max_links} link(s) of {usable_seconds(slurm)} s hold fewer than the run's {max_steps} steps "
                f"x ~{step_time_s:g} s (about {links} links)",
                f"raise max_links to at least {links}, or the time limit",
            )
        )
    return out


@dataclass(frozen=True)
class Partition:
    """What `sinfo` says about a partition: its nodes and the GPUs each has."""

    name: str
    gpus_per_node: list[int]

    @property
    def nodes(self) -> int:
        return len(self.gpus_per_node)


def query_partition(name: str) -> Partition | None:
    """The partition as `sinfo` sees it; None when Slurm cannot be asked (no sinfo, no controller, timeout)."""
    if shutil.which("sinfo") is None:
        return None
    try:
        result = subprocess.run(
            ["sinfo", "--noheader", "--Node", "--partition", name, "--format=%N|%G"],
            capture_output=True,
            text=True,
            timeout=SINFO_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    gpus = {}
    for line in result.stdout.splitlines():
        node, _, gres = line.strip().partition("|")
        if node:
            gpus[node] = sum(int(n) for n in _GPUS.findall(gres))
    return Partition(name, list(gpus.values()))


def partition_problems(slurm: SlurmSettings, gang: Gang) -> list[Violation]:
    """The partition checks, asked of Slurm itself when it answers (else none)."""
    if not slurm.partition:
        return []
    return check_partition(gang, query_partition(slurm.partition))


def check_partition(topology: Gang, partition: Partition | None) -> list[Violation]:
    """Seed 004's rule against the real partition: whole nodes of the partition's GPU count, and enough of them."""
    if partition is None:
        return []
    field = f"{SECTION}.partition"
    if partition.nodes == 0:
        return [Violation(field, f"{partition.name!r} has no nodes (sinfo lists none)", "name an existing partition")]
    out = []
    if partition.nodes < topology.num_nodes:
        out.append(
            Violation(
                "topology.num_nodes",
                f"{topology.num_nodes} nodes, but partition {partition.name!r} has {partition.nodes}",
                "use a larger partition, or fewer nodes (and a smaller role plan)",
            )
        )
    if topology.gpu_variant.lower() == CPU_VARIANT:
        return out
    per_node = max(partition.gpus_per_node)
    if per_node != topology.gpus_per_node:
        total = topology.num_nodes * topology.gpus_per_node
        nodes = f"num_nodes: {total // per_node}" if per_node and total % per_node == 0 else "a matching num_nodes"
        out.append(
            Violation(
                "topology.gpus_per_node",
                f"{topology.gpus_per_node}, but partition {partition.name!r} has {per_node} GPUs per node "
                f"(the gang takes whole nodes, so num_nodes must be total GPUs / {per_node})",
                f"set gpus_per_node: {per_node} and {nodes} for the same {total} GPUs"
                if per_node
                else "pick a partition with GPUs",
            )
        )
    return out


# File systems that several hosts mount (Lustre, GPFS, NFS, ...): Slurm's model is that every node sees the
# submitter's checkout and interpreter at the same path, which only one of these (or a fuse mount of one) gives.
SHARED_FILE_SYSTEMS = frozenset(
    {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs", "wekafs", "panfs", "cifs", "smb3"}
)


@functools.cache
def file_system(path: Path, mounts: Path = Path("/proc/mounts")) -> str | None:
    """The type of the file system holding `path` (the longest mount point above it), or None where the host does
    not say (no /proc/mounts: a Mac). Asked once a process: every version's plan names the same checkout and
    interpreter, and reading the mount table for each made a 50-version dry run 40 ms slower."""
    try:
        table = [line.split() for line in mounts.read_text().splitlines()]
    except OSError:
        return None
    resolved = path.resolve()
    above = [(Path(f[1]), f[2]) for f in table if len(f) >= 3 and resolved.is_relative_to(f[1])]
    return max(above, key=lambda m: len(m[0].parts))[1] if above else None


def shared_disk(checkout: Path, interpreter: Path, mounts: Path = Path("/proc/mounts")) -> dict[str, Any]:
    """What Slurm's jobs run from the submitting host's disk (the interpreter, with `-m rlbuild`, in the checkout)
    and whether other nodes can see it: a shared file system's type says yes; anything else says only this host,
    unless every node mounts the same path (which no check from here can see)."""
    paths = {"checkout": checkout, "interpreter": interpreter}
    types = {name: file_system(path, mounts) for name, path in paths.items()}
    shared = {name: t is not None and (t in SHARED_FILE_SYSTEMS or t.startswith("fuse.")) for name, t in types.items()}
    return {
        "checkout": str(checkout),
        "interpreter": str(interpreter),
        "file_systems": types,
        "all_shared": all(shared.values()),
    }


def format_shared_disk(disk: dict[str, Any]) -> str:
    types = ", ".join(sorted({t or "unknown" for t in disk["file_systems"].values()}))
    verdict = (
        "shared"
        if disk["all_shared"]
        else "not a shared file system: other nodes see it only if they mount the same path (not checked from here)"
    )
    return f"  shared disk    jobs run {disk['interpreter']} -m rlbuild in {disk['checkout']} ({types}: {verdict})"


def plan_section(slurm: SlurmSettings, facts: PlanFacts) -> dict[str, Any]:
    """The Slurm placement and the chain it implies: one job per link of `time_limit`, at most `max_links`."""
    configured = slurm.step_time_s
    step_time = configured if configured is not None else facts.step_time_s
    source = "configured" if configured is not None else ("measured" if step_time is not None else None)
    return {
        **slurm.model_dump(exclude={"step_time_s"}),
        "step_time_s": step_time,
        "step_time_source": source,
        "expected_links": expected_links(slurm, facts.max_steps, step_time),
        "shared_disk": shared_disk(REPO_ROOT, Path(sys.executable)),
    }


def plan_lines(section: dict[str, Any], max_steps: int) -> list[str]:
    if section["expected_links"] is None:
        expected = f"expected links unknown (no step time: set {SECTION}.step_time_s)"
    else:
        expected = (
            f"expected {section['expected_links']} ({max_steps} steps x {section['step_time_s']:g} s "
            f"{section['step_time_source']})"
        )
    return [
        f"  slurm          account {section['account'] or '-'}, partition {section['partition'] or '-'}, "
        f"qos {section['qos'] or '-'}; whole nodes, exclusive, one task per node",
        f"  chain          wall-clock limit {section['time_limit']} per link, checkpoint and hand-over "
        f"{section['signal_lead_s']} s before it; at most {section['max_links']} link(s), {expected}",
        format_shared_disk(section["shared_disk"]),
    ]
