"""Preflight knows the model before any job: its config from the source (the tiny model's JSON, a local folder, a
pinned revision in the HF cache) on the first run and in `rlbuild check`; the staged tokenizer against the data
when the launch is resolved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlbuild.cli import main
from rlbuild.contracts.tinymodel import tiny_model_config
from rlbuild.dev.launches import base_model_dir
from rlbuild.plan.modelcheck import check_staged_inputs, source_model_config
from rlbuild.plan.preflight import check_experiment, parse_experiment
from tests.conftest import EXPERIMENTS
from tests.spine.experiments import SEED_64_GPU, experiment

TP_FIELD = "role_plan.inference_engine_tensor_parallel_size"
SHA = SEED_64_GPU["model"]["revision"]


def _tiny(**recipe_generator: object) -> dict:
    doc = yaml.safe_load((EXPERIMENTS / "tiny-addition.yaml").read_text())
    doc["recipe"]["generator"] = recipe_generator
    return doc


def _fields(doc: dict) -> dict[str, str]:
    _, found = check_experiment(parse_experiment(doc, "t"))
    return {v.field: v.message for v in found}


def test_token_budgets_beyond_the_tiny_models_positions_fail_on_the_first_run() -> None:
    positions = tiny_model_config()["max_position_embeddings"]
    assert _fields(_tiny(max_prompt_length=32, sampling_params={"max_generate_length": 32})) == {}
    found = _fields(_tiny(max_prompt_length=40, sampling_params={"max_generate_length": 30}))
    assert found == {
        "recipe.generator.sampling_params.max_generate_length": "max_prompt_length 40 + max_generate_length 30 = 70 "
        f"tokens, more than the model's max_position_embeddings={positions}"
    }
    doc = _tiny()
    doc["recipe"]["environment"] = {"max_context_tokens": positions + 1}
    assert _fields(doc) == {
        "recipe.environment.max_context_tokens": f"{positions + 1} tokens of an agent episode, more than the model's "
        f"max_position_embeddings={positions}"
    }


def test_rlbuild_check_reads_a_local_models_config_without_staging(tmp_path: Path, capsys) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_attention_heads": 12, "num_key_value_heads": 4}))
    doc = experiment(role_plan__inference_engine_tensor_parallel_size=8)
    doc["model"] = {
        "source": f"local:{model}",
        "revision": "r",
        "tokenizer": {"source": f"local:{model}", "revision": "r"},
    }
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["check", str(path), "--version", "2026.09.21", "--storage-root", str(tmp_path / "r")]) == 2
    assert "TP=8 does not divide the model's num_attention_heads=12" in capsys.readouterr().err


def test_a_pinned_hub_revision_is_read_from_the_hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / SHA
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"num_attention_heads": 32, "max_position_embeddings": 40960}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    doc = experiment(role_plan__inference_engine_tensor_parallel_size=8)
    config = source_model_config(parse_experiment(doc, "t"))
    assert config.values == {"num_attention_heads": 32, "max_position_embeddings": 40960}
    assert config.origin == f"hf:Qwen/Qwen3-8B@{SHA[:12]} (HF cache)"
    (snapshot / "config.json").write_text(json.dumps({"num_attention_heads": 12}))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub") + "/")  # another cache: read again
    assert TP_FIELD in _fields(doc)


def test_offline_without_the_config_in_the_cache_is_not_known_yet(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = source_model_config(parse_experiment(experiment(), "t"))
    assert config.values is None and "HF_HUB_OFFLINE is set" in config.origin


def test_too_few_staged_prompts_fitting_fail_at_resolve_launch(tmp_path: Path) -> None:
    from rlbuild.plan.preflight import compose_recipe

    recipe, _ = compose_recipe(parse_experiment(_tiny(max_prompt_length=6), "t"))
    train = tmp_path / "0.jsonl"
    rows = [{"prompt": "1+2=", "answer": "3"}] * 20 + [{"prompt": "12345+67890=", "answer": "x"}] * 40
    train.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (violation,) = check_staged_inputs(base_model_dir(), [train], recipe)
    assert violation.field == "recipe.generator.max_prompt_length"
    assert violation.message == (
        "only 20 of 60 train rows fit max_prompt_length=6 (the longest prompt is 13 tokens), fewer than "
        "trainer.train_batch_size=32"
    )
    assert violation.fix == "raise max_prompt_length to at least 13, or add shorter prompts"
    assert check_staged_inputs(base_model_dir(), [train], compose_recipe(parse_experiment(_tiny(), "t"))[0]) == []


def test_the_plan_says_what_preflight_knew_of_the_model() -> None:
    from rlbuild.plan.planview import format_plan
    from rlbuild.plan.resolve import resolve

    plan = resolve(parse_experiment(_tiny(), "t"), "2026.09.21", "/tmp/r")
    assert (
        "  model          the tiny model (tiny_model.json): 4 heads, 2 KV heads, 64 positions (prompt + generation "
        "36), vocab 80"
    ) in format_plan(plan)
