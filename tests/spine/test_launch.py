"""The launch document: sections, recipe composition, determinism, no secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlbuild.cli import main
from rlbuild.plan.preflight import parse_experiment
from rlbuild.plan.resolve import resolve
from tests.spine.experiments import experiment, write

SECTIONS = [
    "schema_version",
    "run",
    "runtime",
    "allocation",
    "schedulers",
    "ingress",
    "ray",
    "artifacts",
    "inputs",
    "recipe",
    "env",
    "credentials",
]


def resolve_launch(tmp_path: Path, doc: dict, out: str) -> str:
    path = write(tmp_path, doc)
    folder = tmp_path / out
    args = ["resolve-launch", "--experiment", str(path), "--version", "2026.09.21", "--storage-root", "s3://bucket/p"]
    args += ["--out", str(folder / "launch.yaml"), "--record", str(tmp_path / f"{out}.identity.json")]
    args += ["--plan", str(folder / "plan.txt")]
    assert main(args) == 0
    return (folder / "launch.yaml").read_text()


def test_same_inputs_give_a_byte_identical_document(tmp_path: Path) -> None:
    first = resolve_launch(tmp_path, experiment(), "a")
    second = resolve_launch(tmp_path, experiment(), "b")
    assert first == second
    assert list(yaml.safe_load(first)) == SECTIONS


def test_role_plan_is_rendered_into_the_recipe() -> None:
    plan = resolve(parse_experiment(experiment(), "test"), "2026.09.21", "s3://bucket/p")
    recipe = plan.launch.recipe
    assert recipe.trainer.placement.policy_num_nodes == 4
    assert recipe.trainer.train_batch_size == 64
    assert recipe.generator.inference_engine_data_parallel_size == 8
    assert recipe.generator.n_samples_per_prompt == 8
    assert recipe.trainer.seed == 42


def test_recipe_values_compose_over_the_base() -> None:
    doc = experiment(recipe={"trainer": {"max_steps": 7, "algorithm": {"kl_loss_coef": 0.1}}})
    plan = resolve(parse_experiment(doc, "test"), "2026.09.21", "s3://bucket/p")
    trainer = plan.launch.recipe.trainer
    assert trainer.max_steps == 7
    assert trainer.algorithm.kl_loss_coef == 0.1
    assert trainer.algorithm.eps_clip_low == 0.2  # the typed recipe's default


def test_paths_are_scoped_by_experiment_and_version() -> None:
    plan = resolve(parse_experiment(experiment(), "test"), "2026.09.21", "s3://bucket/p")
    artifacts = plan.launch.artifacts
    assert artifacts.export_root == "s3://bucket/p/seed-64/export/v2026.09.21"
    assert artifacts.checkpoint_root == "s3://bucket/p/seed-64/tmp/ttl=14d/train/v2026.09.21/checkpoints"
    other = resolve(parse_experiment(experiment(name="other"), "test"), "2026.09.21", "s3://bucket/p")
    assert not set(_uris(plan.launch.model_dump())) & set(_uris(other.launch.model_dump()))


def _uris(node: object) -> list[str]:
    if isinstance(node, dict):
        return [u for v in node.values() for u in _uris(v)]
    if isinstance(node, list):
        return [u for v in node for u in _uris(v)]
    return [node] if isinstance(node, str) and node.startswith("s3://") else []


def test_placement_does_not_change_identity() -> None:
    base = resolve(parse_experiment(experiment(), "t"), "2026.09.21", "s3://b/p")
    moved = experiment(execution__iris__cluster="elsewhere", execution__iris__priority="batch")
    other = resolve(parse_experiment(moved, "t"), "2026.09.21", "s3://b/p")
    assert base.records["launch"]["fingerprint"] == other.records["launch"]["fingerprint"]
    changed = resolve(parse_experiment(experiment(seed=7), "t"), "2026.09.21", "s3://b/p")
    assert changed.records["launch"]["fingerprint"] != base.records["launch"]["fingerprint"]
    # The allocation is the gang's nodes under every scheduler; each scheduler's settings sit beside it.
    assert base.launch.allocation.model_dump() == {"num_nodes": 8, "gpus_per_node": 8, "gpu_variant": "H100"}
    assert other.launch.schedulers["iris"]["cluster"] == "elsewhere" and set(other.launch.schedulers) == {"iris"}


def test_a_launch_document_of_the_earlier_schema_is_refused_with_the_fix(tmp_path: Path) -> None:
    from rlbuild.contracts.launch import LaunchDocumentError, dump_launch, load_launch

    plan = resolve(parse_experiment(experiment(), "t"), "2026.09.21", "s3://b/p")
    old = yaml.safe_load(dump_launch(plan.launch))
    old["schema_version"] = 2  # its allocation sat inside `iris:`
    old["iris"] = {"cluster": "c", "allocation": old.pop("allocation"), "priority": None, "max_retries": None}
    del old["schedulers"]
    path = tmp_path / "launch.yaml"
    path.write_text(yaml.safe_dump(old))
    with pytest.raises(LaunchDocumentError) as refused:
        load_launch(str(path))
    assert "is a launch document of schema 2" in str(refused.value)
    assert "snakemake --forcerun resolve_launch" in str(refused.value)


def test_secret_values_never_reach_the_document(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    secret = "hf_SuperSecretTokenValue123"
    monkeypatch.setenv("HF_TOKEN", secret)
    path = write(tmp_path, experiment(execution__iris__cluster=secret))
    args = ["resolve-launch", "--experiment", str(path), "--version", "2026.09.21", "--storage-root", "s3://b/p"]
    args += [
        "--out",
        str(tmp_path / "launch.yaml"),
        "--record",
        str(tmp_path / "r.json"),
        "--plan",
        str(tmp_path / "p"),
    ]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert "holds the value of the secret environment variable HF_TOKEN" in captured.err
    assert secret not in captured.out + captured.err
    assert not (tmp_path / "launch.yaml").exists() and not (tmp_path / "r.json").exists()


def test_the_trainer_reads_the_document_the_builder_writes(tmp_path: Path) -> None:
    from rlbuild.contracts.launch import load_launch

    path = tmp_path / "written"
    resolve_launch(tmp_path, experiment(), "written")
    launch = load_launch(str(path / "launch.yaml"))
    assert launch.inputs.model.uri == "s3://bucket/p/seed-64/stage/model/v2026.09.21"
    assert launch.recipe.trainer.placement.policy_world_size == 32
