"""Per-node sizes are bounded by the largest node a profile declares; export and eval ask for the experiment's
CPUs and memory instead of Snakemake's 1 CPU / 1000 MB."""

from __future__ import annotations

from pathlib import Path

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


def test_export_and_eval_ask_for_the_experiments_cpus_and_memory(tmp_path: Path) -> None:
    path = _tiny(tmp_path, eval={"cpu": 8, "memory": "32GiB"})
    graph = Graph(path, announce=False)
    assert graph.job_resources("eval") == {
        "slurm_account": "rlbuild",
        "slurm_partition": "cpu",
        "cpus_per_task": 8,
        "mem_mb": 34359,
        "iris_cpu": 8,
        "iris_memory": "32GiB",
    }
    assert graph.job_resources("export")["cpus_per_task"] == 2 and graph.job_resources("export")["mem_mb"] == 4000


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
