"""Pure logic of the Slurm path, without a cluster: the experiment's `execution.slurm` section, the resources the
official plugin reads, the chain's arithmetic and preflight checks (seed 004's node-count rule), a task's rank and
attempt from Slurm's variables, its ports, and the environment a job may receive."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlbuild.contracts.metricstream import median_step_time
from rlbuild.core.errors import PreflightError
from rlbuild.core.wire import restrict_to_forwarded
from rlbuild.job.rendezvous import GangTaskError, TaskIdentity
from rlbuild.plan.planview import format_plan
from rlbuild.plan.preflight import parse_experiment
from rlbuild.plan.resolve import resolve
from rlbuild.plan.scheduling import gang_of
from rlbuild.plan.spec import Experiment
from rlbuild.schedulers.base import JobRequest
from rlbuild.schedulers.registry import task_scheduler
from rlbuild.schedulers.slurm import plan as slurm
from rlbuild.schedulers.slurm.scheduler import PORT_BAND, Slurm
from tests.spine.experiments import experiment

REPO = Path(__file__).resolve().parents[2]

# Seed 004: 56 GPUs on Jupiter's GH200 nodes (4 GPUs each) is 14 nodes; 12-hour limit, chained.
JUPITER = {"account": "reformo", "partition": "booster", "qos": "normal", "time_limit": "11:59:00"}


def parsed(**changes: Any) -> Experiment:
    # The fixture's experiment runs on Iris: this one runs on Slurm instead (one scheduler section at most).
    return parse_experiment(
        experiment(**{"execution__iris": None, "execution__slurm": dict(JUPITER), **changes}), "test"
    )


def gang_resources(exp: Experiment) -> dict[str, int | str]:
    """What the Slurm executor reads of the train rule, through the scheduler interface."""
    return Slurm.rule_resources(exp.execution.slurm, JobRequest(gang=gang_of(exp)))


def test_a_slurm_section_is_placement_with_checked_sizes_and_time_limits() -> None:
    exp = parsed(execution__slurm__memory_per_node="480GB", execution__slurm__max_links=6)
    assert exp.execution.slurm is not None
    assert exp.execution.slurm.time_limit_s == 11 * 3600 + 59 * 60
    with pytest.raises(PreflightError) as error:
        parsed(execution__slurm__time_limit="12h", execution__slurm__memory_per_node="lots")
    fields = {v.field for v in error.value.violations}
    assert fields == {"execution.slurm.time_limit", "execution.slurm.memory_per_node"}
    assert "11:59:00" in str(error.value)


def test_the_train_gang_is_whole_exclusive_nodes_one_task_each_warned_before_the_limit() -> None:
    resources = gang_resources(parsed(execution__slurm__signal_lead_s=600, execution__slurm__cpus_per_node=72))
    assert resources["nodes"] == 8 and resources["gres"] == "gpu:8"
    assert resources["runtime"] == 719 and resources["cpus_per_task"] == 72
    assert resources["slurm_account"] == "reformo" and resources["slurm_partition"] == "booster"
    assert resources["qos"] == "normal" and resources["mpi"] == ""
    extra = resources["slurm_extra"].split()
    assert {"--exclusive", "--ntasks-per-node=1", "--requeue", "--signal=USR1@600"} <= set(extra)
    assert resources["chain_max_links"] == 4 and resources["chain_signal_lead_s"] == 600
    cpu = gang_resources(parsed(topology__gpu_variant="cpu"))
    assert "gres" not in cpu and cpu["tasks"] == 8  # CPU ranks: no GPU request, one task per node
    assert gang_resources(parse_experiment(experiment(), "t")) == {}  # no Slurm section: nothing for Slurm


def test_every_chain_problem_is_reported_at_once_with_field_value_and_fix() -> None:
    exp = parsed(execution__slurm={"time_limit": "00:10:00", "signal_lead_s": 900})
    problems = {v.field: str(v) for v in slurm.check_chain(exp.execution.slurm, 500, 10, step_time_s=None)}
    assert set(problems) == {"execution.slurm.account", "execution.slurm.partition", "execution.slurm.signal_lead_s"}
    assert "900 s is not shorter than time_limit 00:10:00" in problems["execution.slurm.signal_lead_s"]


def test_a_measured_step_time_checks_the_lead_one_checkpoint_interval_and_the_links() -> None:
    exp = parsed(execution__slurm=dict(JUPITER, time_limit="01:00:00", signal_lead_s=60, max_links=2))
    assert slurm.check_chain(exp.execution.slurm, 100, 10, step_time_s=30.0) == []
    assert slurm.expected_links(exp.execution.slurm, 100, 30.0) == 1
    problems = {v.field: str(v) for v in slurm.check_chain(exp.execution.slurm, 1000, 200, step_time_s=90.0)}
    assert "shorter than one step (~90 s)" in problems["execution.slurm.signal_lead_s"]
    assert "under one checkpoint interval (200 steps x ~90 s" in problems["execution.slurm.time_limit"]
    assert "raise max_links to at least 26" in problems["execution.slurm.max_links"]
    lines = [{"step": 1, "perf/step_time_s": 3}, {"step": 2, "perf/step_time_s": 5}, {"step": 3}]
    assert median_step_time(lines) == 4 and median_step_time([]) is None


@pytest.mark.parametrize(
    ("gpus", "nodes", "fields", "fix"),
    [
        ([4] * 20, 20, {"topology.gpus_per_node"}, "set gpus_per_node: 4 and num_nodes: 16 for the same 64 GPUs"),
        ([8] * 4, 4, {"topology.num_nodes"}, "use a larger partition"),
        ([8] * 8, 8, set(), ""),
    ],
)
def test_seed_004_node_count_rule_against_the_partition(gpus: list[int], nodes: int, fields: set, fix: str) -> None:
    problems = slurm.check_partition(gang_of(parsed()), slurm.Partition("booster", gpus))
    assert {v.field for v in problems} == fields
    assert fix in " ".join(str(v) for v in problems)
    assert slurm.check_partition(gang_of(parsed()), None) == []  # Slurm not reachable: nothing to check against


def test_cpu_ranks_need_no_gpus_and_a_missing_partition_is_named() -> None:
    assert slurm.check_partition(gang_of(parsed(topology__gpu_variant="cpu")), slurm.Partition("cpu", [0] * 8)) == []
    (problem,) = slurm.check_partition(gang_of(parsed()), slurm.Partition("bosster", []))
    assert problem.field == "execution.slurm.partition" and "'bosster' has no nodes" in str(problem)


def test_the_plan_shows_the_slurm_placement_and_the_expected_links(tmp_path: Path) -> None:
    exp = parsed(execution__slurm=dict(JUPITER, step_time_s=600.0, max_links=5, signal_lead_s=600))
    text = format_plan(resolve(exp, "2026.09.21", str(tmp_path)))  # 200 steps x 600 s over 11:59:00 - 600 s
    assert "slurm          account reformo, partition booster, qos normal" in text
    assert "wall-clock limit 11:59:00 per link, checkpoint and hand-over 600 s before it; at most 5 link(s)" in text
    assert "expected 3 (200 steps x 600 s configured)" in text
    assert f"shared disk    jobs run {sys.executable} -m rlbuild in {REPO}" in text


def test_the_shared_disk_line_tells_a_cluster_file_system_from_this_hosts(tmp_path: Path) -> None:
    """Slurm nodes run the submitter's interpreter in its checkout at the same path: the plan says whether those
    sit on a file system other hosts mount (the longest mount point above each path decides)."""
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/nvme0n1p1 / ext4 rw 0 0\n"
        "fs1:/home /home nfs4 rw 0 0\n"
        "tmpfs /home/me/scratch tmpfs rw 0 0\n"
        "lustre@o2ib:/proj /proj lustre rw 0 0\n"
    )
    on_cluster = slurm.shared_disk(Path("/proj/rl/rlbuild"), Path("/home/me/venv/bin/python"), mounts)
    assert on_cluster["file_systems"] == {"checkout": "lustre", "interpreter": "nfs4"} and on_cluster["all_shared"]
    assert "(lustre, nfs4: shared)" in slurm.format_shared_disk(on_cluster)
    local = slurm.shared_disk(Path("/home/me/scratch/rlbuild"), Path("/usr/bin/python3"), mounts)
    assert local["file_systems"] == {"checkout": "tmpfs", "interpreter": "ext4"} and not local["all_shared"]
    assert "not a shared file system: other nodes see it only if they mount the same path" in (
        slurm.format_shared_disk(local)
    )
    unknown = slurm.shared_disk(Path("/proj/x"), Path("/usr/bin/python3"), tmp_path / "no-such-table")
    assert unknown["file_systems"] == {"checkout": None, "interpreter": None} and not unknown["all_shared"]


def test_a_slurm_task_takes_rank_and_attempt_from_slurms_variables() -> None:
    def task(environ: dict[str, str]) -> TaskIdentity:
        return task_scheduler(environ).task(environ)

    assert task({"SLURM_JOB_ID": "4711", "SLURM_PROCID": "3", "SLURM_RESTART_COUNT": "2"}) == TaskIdentity(
        "slurm-4711", 3, 2, "slurm"
    )
    assert task({"SLURM_JOB_ID": "9", "SLURM_PROCID": "0"}).attempt == 0
    iris = {"IRIS_TASK_ID": "/u/job/1:0", "SLURM_JOB_ID": "9", "SLURM_PROCID": "0"}
    assert task(iris) == TaskIdentity("/u/job", 1, 0, "iris")
    with pytest.raises(GangTaskError, match="SLURM_PROCID='x'"):
        task({"SLURM_JOB_ID": "9", "SLURM_PROCID": "x"})
    with pytest.raises(GangTaskError, match="no task of a scheduler rlbuild knows"):
        task({"SLURM_JOB_ID": "9"})  # a batch script, not a task of a step: no rank


def test_slurm_ranks_take_free_ports_from_bands_of_their_own() -> None:
    ranks = [Slurm().gang_ports({}, rank) for rank in (0, 1)]
    assert all(len(set(p.values())) == len(p) for p in ranks)
    assert set(ranks[0].values()).isdisjoint(ranks[1].values())
    low = min(ranks[0].values())
    with socket.socket() as taken:  # a port in use is skipped, not handed out
        taken.bind(("", low))
        assert low not in Slurm().gang_ports({}, 0).values()
    assert max(ranks[0].values()) < low + PORT_BAND


def test_a_slurm_job_gets_the_allow_list_and_process_basics_only() -> None:
    environ = {
        "PATH": "/bin",
        "HOME": "/root",
        "AWS_SECRET_ACCESS_KEY": "s",
        "R2_TOKEN": "t",
        "GITHUB_TOKEN": "g",
        "HF_TOKEN": "h",
        "RLBUILD_BUCKET": "b",
        "SNAKEMAKE_STORAGE_S3_SECRET_KEY": "k",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "LC_ALL": "C",
    }
    removed = restrict_to_forwarded(environ, scheduler_prefixes=Slurm.variable_prefixes)
    assert removed == ["AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "R2_TOKEN"]
    assert set(environ) == {
        "PATH",
        "HOME",
        "HF_TOKEN",
        "RLBUILD_BUCKET",
        "SNAKEMAKE_STORAGE_S3_SECRET_KEY",
        "SLURM_CONF",
        "LC_ALL",
    }


def test_a_slurm_job_keeps_the_experiments_env() -> None:
    environ = {"PATH": "/bin", "NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO", "GITHUB_TOKEN": "g"}
    removed = restrict_to_forwarded(environ, ["NCCL_P2P_DISABLE"])
    assert removed == ["GITHUB_TOKEN", "NCCL_DEBUG"]
    assert environ == {"PATH": "/bin", "NCCL_P2P_DISABLE": "1"}


# A rank whose first slow step (reading the launch document) meets Slurm's warning: the signal arrives inside it.
WARNED_WHILE_STARTING = """
import os, signal, sys
from rlbuild.core.errors import RlbuildError
from rlbuild.job import gang
from rlbuild.schedulers import gangtask

def check_runtime(launch, environ):
    os.kill(os.getpid(), signal.SIGUSR1)
    raise RlbuildError("the launch document said no")

gang.check_runtime = check_runtime
sys.argv = ["gangtask", "--nodes", "1", "--gang-id", "g", "--launch", "launch.yaml", "--", "true"]
sys.exit(gangtask.main())
"""


def test_the_wall_clock_warning_never_kills_a_gang_task_still_starting() -> None:
    """Slurm sends its warning once, to every process of the step, seconds after a link starts when the lead is
    close to the limit: a rank still reading its launch document logs it and goes on (it used to die of SIGUSR1,
    and the chain waited out its limit)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "IRIS_"))}
    task = subprocess.run(
        [sys.executable, "-c", WARNED_WHILE_STARTING], capture_output=True, text=True, env=environ, timeout=120
    )
    assert "wall-clock warning (SIGUSR1)" in task.stderr
    assert task.returncode == 2, task.stderr  # it went on to its own error; SIGUSR1's default action gives -10
    assert "error: the launch document said no" in task.stderr
