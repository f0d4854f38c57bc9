"""What a job asks of Slurm through the official executor plugin, and what preflight asks of Slurm itself.

The plugin (`snakemake-executor-plugin-slurm`) submits every job with `sbatch` and reads rule resources:
`slurm_account`, `slurm_partition`, `qos`, `runtime` (minutes), `nodes`, `gres`, `cpus_per_task`, `mem_mb`,
`slurm_extra`, `tasks`, and `mpi`. The train job is one Slurm job of whole nodes, one task per node, requeueable,
warned `signal_lead_s` before its limit. Its job step must run the Snakemake job in the batch step (not under
`srun -n1`), so that `rlbuild train` can start the gang on every node itself (rlbuild/job/chain.py): the job step
(slurm-jobstep 0.6) does so for any job that declares `mpi`. The value is empty on purpose: the submitting side
(2.8) treats a non-empty `mpi` as an MPI job, which it refuses for one task per node (it wants `tasks` > 1).

Dependency-light on purpose: it runs while Snakemake builds the DAG.
"""

from __future__ import annotations

import functools
import math
import re
import shutil
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbuild.contracts.launch import CPU_VARIANT
from rlbuild.contracts.metricstream import STEP_TIME
from rlbuild.core.errors import Violation
from rlbuild.plan.spec import Experiment, SlurmExecution, size_bytes

SINFO_TIMEOUT_S = 5.0
SECTION = "execution.slurm"
_GPUS = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


# The resources below that only Slurm's executors read (the others, chain_*, mem_mb, cpus_per_task, runtime, are
# read by the rule's command or by other executors too).
SLURM_ONLY = frozenset({"slurm_account", "slurm_partition", "qos", "slurm_extra", "mpi", "gres", "tasks", "nodes"})


def gang_resources(experiment: Experiment) -> dict[str, int | str]:
    """Rule resources of the train gang; the chain settings (`chain_*`) are read by the rule's command."""
    slurm = experiment.execution.slurm
    if slurm is None:
        return {"chain_max_links": 1, "chain_signal_lead_s": 0}
    topology = experiment.topology
    extra = ["--exclusive", "--ntasks-per-node=1", "--requeue", "--open-mode=append"]
    extra.append(f"--signal=USR1@{slurm.signal_lead_s}")
    resources: dict[str, int | str] = {
        **cluster_resources(experiment),
        "runtime": math.ceil(slurm.time_limit_s / 60),
        "nodes": topology.num_nodes,
        "mpi": "",  # present: the batch step runs the job; empty: not an MPI job to the submitter
        "slurm_extra": " ".join(extra),
        # No --mem unless stated: an exclusive job then gets the partition's default, usually the whole node.
        "mem_mb": size_bytes(slurm.memory_per_node) // 10**6 if slurm.memory_per_node else 0,
        "chain_max_links": slurm.max_links,
        "chain_signal_lead_s": slurm.signal_lead_s,
    }
    if topology.gpu_variant.lower() != CPU_VARIANT:
        resources["gres"] = f"gpu:{topology.gpus_per_node}"
    else:  # without GPUs the plugin asks for --ntasks (default 1, which would shrink the job to one node)
        resources["tasks"] = topology.num_nodes
    if slurm.cpus_per_node:
        resources["cpus_per_task"] = slurm.cpus_per_node
    return resources


def cluster_resources(experiment: Experiment) -> dict[str, int | str]:
    """Account, partition and QoS of every job the experiment sends to Slurm."""
    slurm = experiment.execution.slurm
    if slurm is None:
        return {}
    named = {"slurm_account": slurm.account, "slurm_partition": slurm.partition, "qos": slurm.qos}
    return {key: value for key, value in named.items() if value}


def usable_seconds(slurm: SlurmExecution) -> int:
    """Seconds of training one link holds: its limit less the lead at which it hands over."""
    return slurm.time_limit_s - slurm.signal_lead_s


def expected_links(slurm: SlurmExecution, max_steps: int, step_time_s: float | None) -> int | None:
    """Jobs the chain is expected to take (start-up time aside), or None without a step time."""
    if step_time_s is None or usable_seconds(slurm) <= 0:
        return None
    return max(1, math.ceil(max_steps * step_time_s / usable_seconds(slurm)))


def measured_step_time(records: list[dict[str, Any]]) -> float | None:
    """The median `perf/step_time_s` of a run's metric lines (an earlier link or run of this version)."""
    times = [float(v) for r in records if isinstance(v := r.get(STEP_TIME), int | float) and v > 0]
    return statistics.median(times) if times else None


def check_chain(
    experiment: Experiment, max_steps: int, ckpt_interval: int, step_time_s: float | None
) -> list[Violation]:
    """Account and partition set; the lead inside the limit; with a step time, one checkpoint interval and the
    whole run (in at most max_links links) fitting the limit."""
    slurm = experiment.execution.slurm
    if slurm is None:
        return []
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


def partition_problems(experiment: Experiment) -> list[Violation]:
    """The partition checks, asked of Slurm itself when it answers (else none)."""
    slurm = experiment.execution.slurm
    if slurm is None or not slurm.partition:
        return []
    return check_partition(experiment, query_partition(slurm.partition))


def check_partition(experiment: Experiment, partition: Partition | None) -> list[Violation]:
    """Seed 004's rule against the real partition: whole nodes of the partition's GPU count, and enough of them."""
    slurm, topology = experiment.execution.slurm, experiment.topology
    if slurm is None or partition is None:
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
