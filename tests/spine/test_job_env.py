"""`execution.env`: plain variables for the job's tasks, refused when secret-looking, shown in the plan, in the
launch identity only when they change numerics, and declared to Snakemake so every executor hands them over."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlbuild.core.errors import PreflightError
from rlbuild.plan.planview import format_plan
from rlbuild.plan.preflight import parse_experiment
from rlbuild.plan.resolve import resolve
from tests.conftest import EXPERIMENTS, run_snakemake
from tests.spine.experiments import experiment

PLACEMENT_ENV = {"NCCL_P2P_DISABLE": 1, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


def _launch_fingerprint(env: dict[str, object]) -> str:
    plan = resolve(parse_experiment(experiment(execution__env=env), "t"), "2026.09.21", "/tmp/r")
    return plan.records["launch"]["fingerprint"]


def test_secret_looking_storage_and_reserved_names_are_refused_all_at_once() -> None:
    env = {"HF_TOKEN": "x", "MY_API_KEY": "y", "AWS_REGION": "z", "R2_BUCKET": "b", "RLBUILD_PREFIX": "p", "9X": "1"}
    with pytest.raises(PreflightError) as caught:
        parse_experiment(experiment(execution__env={**env, "NCCL_DEBUG": True}), "exp.yaml")
    message = str(caught.value)
    assert "execution.env" in message
    for name in ("HF_TOKEN looks like a secret", "MY_API_KEY looks like a secret", "AWS_REGION: AWS_*/R2_*"):
        assert name in message
    assert "R2_BUCKET: AWS_*/R2_*" in message and "RLBUILD_PREFIX is set by rlbuild" in message
    assert "'9X' is not an environment variable name" in message
    assert 'NCCL_DEBUG: True is not text; quote it (e.g. NCCL_DEBUG: "1")' in message


def test_placement_variables_stay_out_of_identity_and_numeric_ones_enter_it() -> None:
    plain = _launch_fingerprint({})
    assert _launch_fingerprint(PLACEMENT_ENV) == plain
    assert _launch_fingerprint({"NCCL_ALGO": "Ring"}) != plain
    assert _launch_fingerprint({"NCCL_ALGO": "Tree"}) != _launch_fingerprint({"NCCL_ALGO": "Ring"})


def test_the_plan_and_the_launch_document_carry_the_env() -> None:
    doc = experiment(execution__env={**PLACEMENT_ENV, "NCCL_ALGO": "Ring"})
    plan = resolve(parse_experiment(doc, "t"), "2026.09.21", "/tmp/r")
    assert plan.launch.env == {
        "NCCL_ALGO": "Ring",
        "NCCL_P2P_DISABLE": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }
    assert (
        "job env        NCCL_P2P_DISABLE=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (placement); "
        "NCCL_ALGO=Ring (numerics: in the launch identity)"
    ) in format_plan(plan)


def test_the_snakefile_declares_the_env_and_overrides_the_submitters_value(tmp_path: Path) -> None:
    """A real dry run: the Snakefile sets the experiment's value over the submitter's and declares the name to
    Snakemake (which hands declared variables to Iris tasks; Slurm's --export=ALL carries them)."""
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["execution"]["env"] = {"NCCL_P2P_DISABLE": "1"}
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    args = ["-n", "--config", f"experiment={path}", f"storage_root={tmp_path / 'results'}"]
    result = run_snakemake(args, cwd=tmp_path, env={"NCCL_P2P_DISABLE": "0"})
    assert result.returncode == 0, result.stderr
    assert "job env        NCCL_P2P_DISABLE=1 (placement); - (numerics: in the launch identity)" in result.stderr
