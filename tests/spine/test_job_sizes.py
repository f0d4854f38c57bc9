"""Per-node sizes are bounded by the largest node a profile declares; export and eval ask for the experiment's
CPUs and memory instead of Snakemake's 1 CPU / 1000 MB."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from rlbuild.core.errors import PreflightError
from rlbuild.plan.preflight import parse_experiment
from rlbuild.workflow import Graph
from tests.conftest import EXPERIMENTS, run_snakemake
from tests.spine.experiments import experiment


def _tiny(tmp_path: Path, **execution: object) -> Path:
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["execution"] |= execution
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _seen_by(graph: Graph, executor: str, resources: dict[str, object]) -> dict[str, object]:
    """The resources as Snakemake evaluates them for a job under `executor` (a function answering None: dropped)."""
    graph.workflow = SimpleNamespace(executor_plugin=SimpleNamespace(name=executor))
    values = {k: v(SimpleNamespace()) if callable(v) else v for k, v in resources.items()}
    return {k: v for k, v in values.items() if v is not None}


def test_export_and_eval_ask_for_the_experiments_cpus_and_memory(tmp_path: Path) -> None:
    path = _tiny(tmp_path, eval={"cpu": 8, "memory": "32GiB"})
    graph = Graph(path, announce=False, on_cluster=True)
    every = {
        "slurm_account": "rlbuild",
        "slurm_partition": "cpu",
        "cpus_per_task": 8,
        "mem_mb": 34359,
        "iris_cpu": 8,
        "iris_memory": "32GiB",
    }
    assert _seen_by(graph, "dryrun", graph.job_resources("eval")) == every
    # Each scheduler's job lists what is asked of that scheduler; a local job, neither's.
    assert _seen_by(graph, "slurm", graph.job_resources("eval")) == {
        k: v for k, v in every.items() if not k.startswith("iris_")
    }
    assert _seen_by(graph, "iris", graph.job_resources("eval")) == {
        k: v for k, v in every.items() if not k.startswith("slurm_")
    }
    assert _seen_by(graph, "local", graph.job_resources("eval")) == {"cpus_per_task": 8, "mem_mb": 34359}
    gang = _seen_by(graph, "slurm-jobstep", graph.gang_resources())
    assert gang["mpi"] == "" and "iris_cpu" not in gang  # the jobstep reads `mpi` inside the Slurm job
    assert _seen_by(graph, "local", graph.gang_resources())["chain_max_links"] >= 1
    assert graph.job_resources("export")["cpus_per_task"] == 2 and graph.job_resources("export")["mem_mb"] == 4000


def test_a_local_run_asks_no_scheduler_and_a_job_inside_slurm_still_sees_its_resources(tmp_path: Path) -> None:
    """Snakemake's own process with no cluster executor runs every job itself: the resources only a scheduler
    reads are left out (not functions its 350 jobs call each dry run); a job Snakemake spawns keeps them (the
    Slurm jobstep executor reads `mpi` inside the job)."""
    path = _tiny(tmp_path)
    local = Graph(path, announce=True, on_cluster=False)
    spawned = Graph(path, announce=False, on_cluster=False)
    for kind in ("eval", "export"):
        resources = local.job_resources(kind)
        assert not any(callable(v) for v in resources.values())
        assert resources == _seen_by(spawned, "local", spawned.job_resources(kind))
    gang = local.gang_resources()
    assert not any(callable(v) for v in gang.values()) and "mpi" not in gang
    assert gang == _seen_by(spawned, "local", spawned.gang_resources())
    assert _seen_by(spawned, "slurm-jobstep", spawned.gang_resources())["mpi"] == ""


def test_sizes_parse_with_units_and_name_the_field() -> None:
    with pytest.raises(PreflightError) as caught:
        parse_experiment(experiment(execution__export={"cpu": 0, "memory": "lots"}), "exp.yaml")
    message = str(caught.value)
    assert "execution.export.cpu" in message and "execution.export.memory" in message
    assert "'lots' is not a size; write it like '512GB' or '64GiB'" in message


def test_a_profiles_node_sizes_bound_what_the_experiment_asks_for(tmp_path: Path) -> None:
    path = _tiny(tmp_path, eval={"cpu": 2, "memory": "100GB"})
    args = ["-n", "--config", f"experiment={path}", f"storage_root={tmp_path / 'r'}", "node_memory=64GB", "node_cpu=16"]
    result = run_snakemake(args, cwd=tmp_path)
    assert result.returncode != 0
    assert "execution.eval.memory: asks for 100GB but the largest node the profile declares has memory 64GB" in (
        result.stderr
    )
    assert "execution.iris" not in result.stderr  # 4 CPUs and 8GB fit
    fits = run_snakemake([*args[:-2], "node_memory=128GB", "node_cpu=16"], cwd=tmp_path)
    assert fits.returncode == 0, fits.stderr
