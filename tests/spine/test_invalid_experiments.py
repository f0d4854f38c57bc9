"""Table of invalid experiment files: each one fails `rlbuild check` with its exact error, writes nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlbuild.cli import main
from tests.spine.experiments import DELETE, experiment, write

RP = "role_plan__"
SEPARATE_8X8 = {
    "role_plan__colocate_all": True,
    "role_plan__policy_num_nodes": 8,
    "role_plan__num_inference_engines": 64,
    "role_plan__inference_engine_data_parallel_size": 1,
}

# (id, changes to the 64-GPU seed example, version, [(field, exact message or the start of it), ...])
CASES: list[tuple[str, dict[str, Any], str, list[tuple[str, str]]]] = [
    (
        "nodes-zero",
        {"topology__num_nodes": 0},
        "dev",
        [("topology.num_nodes", "Input should be greater than 0 (got 0)")],
    ),
    (
        "gpus-negative",
        {"topology__gpus_per_node": -8},
        "dev",
        [("topology.gpus_per_node", "Input should be greater than 0 (got -8)")],
    ),
    (
        "policy-nodes-zero",
        {RP + "policy_num_nodes": 0},
        "dev",
        [("role_plan.policy_num_nodes", "Input should be greater than 0 (got 0)")],
    ),
    (
        "ref-negative",
        {RP + "ref_num_nodes": -1},
        "dev",
        [("role_plan.ref_num_nodes", "Input should be greater than or equal to 0 (got -1)")],
    ),
    ("missing-train-batch", {RP + "train_batch_size": DELETE}, "dev", [("role_plan.train_batch_size", "is required")]),
    (
        "typo-in-role-plan",
        {RP + "policy_num_nodes": DELETE, RP + "polcy_num_nodes": 4},
        "dev",
        [("role_plan.policy_num_nodes", "is required"), ("role_plan.polcy_num_nodes", "unknown key")],
    ),
    ("unknown-top-level", {"modle": {}}, "dev", [("modle", "unknown key")]),
    (
        "entrypoint-unknown",
        {"runtime__entrypoint": "ppo"},
        "dev",
        [("runtime.entrypoint", "Input should be 'grpo' or 'fully_async' (got 'ppo')")],
    ),
    (
        "strategy-unknown",
        {"runtime__strategy": "deepspeed"},
        "dev",
        [("runtime.strategy", "Input should be 'fsdp2' or 'megatron' (got 'deepspeed')")],
    ),
    (
        "strategy-not-installed",
        {"runtime__strategy": "megatron"},
        "dev",
        [("runtime.strategy", "'megatron': this runtime installs no megatron-core backend")],
    ),
    (
        "rollout-dp-one-36-gpus",
        {RP + "inference_engine_data_parallel_size": 1},
        "dev",
        [("role_plan.inference_engine_data_parallel_size", "rollout DP=1 describes 36 of 64 GPUs")],
    ),
    (
        "colocated-slice-not-tiling",
        {**SEPARATE_8X8, RP + "inference_engine_tensor_parallel_size": 3, RP + "num_inference_engines": 21},
        "dev",
        [
            ("role_plan.inference_engine_tensor_parallel_size", "colocated engine slice TP*PP=3*1=3 does not tile"),
            ("role_plan.num_inference_engines", "colocated policy GPUs (8*8=64) != rollout GPUs"),
        ],
    ),
    (
        "colocated-gpus-mismatch",
        {**SEPARATE_8X8, RP + "num_inference_engines": 32},
        "dev",
        [("role_plan.num_inference_engines", "colocated policy GPUs (8*8=64) != rollout GPUs (engines 32 * TP 1")],
    ),
    (
        "engine-exceeds-node",
        {
            RP + "inference_engine_tensor_parallel_size": 4,
            RP + "inference_engine_data_parallel_size": 4,
            RP + "num_inference_engines": 2,
        },
        "dev",
        [("role_plan.inference_engine_data_parallel_size", "one engine's ranks TP*PP*DP=4*1*4=16 do not fit")],
    ),
    (
        # 24 free GPUs add up, but a 3-GPU engine stays on one 8-GPU node: 2 per node, 6 on 3 nodes.
        "engines-do-not-pack-onto-free-nodes",
        {
            "topology__num_nodes": 7,
            RP + "num_inference_engines": 8,
            RP + "inference_engine_tensor_parallel_size": 3,
            RP + "inference_engine_data_parallel_size": 1,
        },
        "dev",
        [
            (
                "role_plan.num_inference_engines",
                "8 engines of TP*PP*DP=3*1*1=3 GPUs do not pack onto the 3 free 8-GPU node(s) (nodes 4-6): an engine "
                "stays on one node, so 2 fit per node, 6 in all",
            )
        ],
    ),
    (
        "ep-not-dividing",
        {RP + "inference_engine_expert_parallel_size": 3},
        "dev",
        [("role_plan.inference_engine_expert_parallel_size", "EP=3 does not divide TP*DP=1*8=8")],
    ),
    (
        "train-not-multiple-of-mini",
        {RP + "train_batch_size": 60},
        "dev",
        [("role_plan.policy_mini_batch_size", "train_batch_size=60 is not a multiple of policy_mini_batch_size=16")],
    ),
    (
        "rank-samples-not-multiple-of-micro",
        {RP + "micro_train_batch_size_per_gpu": 3},
        "dev",
        [
            (
                "role_plan.micro_train_batch_size_per_gpu",
                "each policy rank gets 4 samples per mini batch, not a multiple of micro_train_batch_size_per_gpu=3",
            )
        ],
    ),
    (
        "mini-samples-not-splitting",
        {RP + "n_samples_per_prompt": 3},
        "dev",
        [("role_plan.policy_mini_batch_size", "a mini batch of 16 prompts * 3 samples = 48 samples does not split")],
    ),
    (
        "single-sample",
        {
            RP + "n_samples_per_prompt": 1,
            RP + "policy_mini_batch_size": 32,
            RP + "train_batch_size": 64,
            RP + "micro_train_batch_size_per_gpu": 1,
        },
        "dev",
        [("role_plan.n_samples_per_prompt", "n_samples_per_prompt=1: GRPO advantages are relative")],
    ),
    (
        "fully-async-batches",
        {"runtime__entrypoint": "fully_async"},
        "dev",
        [("role_plan.policy_mini_batch_size", "fully_async needs train_batch_size == policy_mini_batch_size")],
    ),
    (
        "fully-async-colocated",
        {"runtime__entrypoint": "fully_async", **SEPARATE_8X8, RP + "train_batch_size": 16},
        "dev",
        [("role_plan.colocate_all", "fully_async generates while training")],
    ),
    (
        "policy-exceeds-nodes",
        {RP + "policy_num_nodes": 9},
        "dev",
        [
            ("role_plan.policy_num_nodes", "policy_num_nodes=9 exceeds topology.num_nodes=8"),
            (
                "role_plan.policy_mini_batch_size",
                "a mini batch of 16 prompts * 8 samples = 128 samples does not split over 72",
            ),
            (
                "topology.num_nodes",
                "the plan describes 104 of 64 allocated GPUs (policy 72 + reference 0 + rollout 4*1*1*8=32)",
            ),
        ],
    ),
    (
        "policy-partial-node",
        {RP + "policy_num_gpus_per_node": 4},
        "dev",
        [
            ("role_plan.policy_num_gpus_per_node", "policy_num_gpus_per_node=4 does not fill a 8-GPU node"),
            # 6 engines would make 64 GPUs, but not on the 4 nodes a whole-node policy leaves: no fix offered.
            ("topology.num_nodes", "the plan describes 48 of 64 allocated GPUs"),
        ],
    ),
    (
        "colocated-with-ref-nodes",
        {**SEPARATE_8X8, RP + "ref_num_nodes": 1},
        "dev",
        [("role_plan.ref_num_nodes", "ref_num_nodes=1 with colocate_all=true")],
    ),
    (
        "retention-count-high",
        {"retention__resume_checkpoint_count": 6},
        "dev",
        [("retention.resume_checkpoint_count", "Input should be less than or equal to 5 (got 6)")],
    ),
    (
        "retention-ttl-zero",
        {"retention__temporary_storage_ttl_days": 0},
        "dev",
        [("retention.temporary_storage_ttl_days", "Input should be greater than 0 (got 0)")],
    ),
    ("name-not-a-segment", {"name": "../etc"}, "dev", [("name", "Value error, '../etc' is not a path segment")]),
    (
        "recipe-unknown-key",
        {"recipe": {"trainer": {"max_stpes": 5}}},
        "dev",
        [("recipe.trainer.max_stpes", "unknown key")],
    ),
    (
        "recipe-contradicts-plan",
        {"recipe": {"trainer": {"train_batch_size": 32}}},
        "dev",
        [("recipe.trainer.train_batch_size", "states 32 but role_plan renders 64")],
    ),
    (
        "recipe-type-differs",
        {"recipe": {"generator": {"n_samples_per_prompt": 8.0}}},
        "dev",
        [("recipe.generator.n_samples_per_prompt", "states 8.0 but role_plan renders 8")],
    ),
    (
        "recipe-strategy-differs",
        {"recipe": {"trainer": {"strategy": "megatron"}}},
        "dev",
        [("recipe.trainer.strategy", "states 'megatron' but runtime.strategy renders 'fsdp2'")],
    ),
    (
        "recipe-loss-reduction",
        {"recipe": {"trainer": {"algorithm": {"loss_reduction": "mean"}}}},
        "dev",
        [
            (
                "recipe.trainer.algorithm.loss_reduction",
                "Input should be 'token_mean', 'seq_mean_token_sum' or 'seq_mean_token_mean' (got 'mean')",
            )
        ],
    ),
    (
        "recipe-tis-without-cap",
        {"recipe": {"trainer": {"algorithm": {"use_tis": True}}}},
        "dev",
        [("recipe.trainer.algorithm.tis_imp_ratio_cap", "use_tis=true needs a positive cap, got -1.0")],
    ),
    (
        "recipe-greedy-rollouts",
        {"recipe": {"generator": {"sampling_params": {"temperature": 0.0}}}},
        "dev",
        [("recipe.generator.sampling_params.temperature", "must be > 0 for GRPO rollouts (got 0.0)")],
    ),
    (
        "hf-revision-unpinned",
        {"model__revision": "main"},
        "dev",
        [("model.source", "source hf:Qwen/Qwen3-8B has revision 'main', which is not a commit sha")],
    ),
    (
        "data-unknown-scheme",
        {"data__train": [{"source": "ftp:x", "revision": "a"}]},
        "dev",
        [("data.train.0.source", "source 'ftp:x' has no known scheme")],
    ),
    (
        "memory-not-a-size",
        {"execution__iris__memory": "lots"},
        "dev",
        [("execution.iris.memory", "Value error, 'lots' is not a size")],
    ),
    (
        "priority-unknown",
        {"execution__iris__priority": "urgent"},
        "dev",
        [("execution.iris.priority", "Input should be 'production', 'interactive' or 'batch' (got 'urgent')")],
    ),
    ("seed-as-string", {"seed": "42"}, "dev", [("seed", "Input should be a valid integer (got '42')")]),
    (
        "colocate-as-string",
        {RP + "colocate_all": "true"},
        "dev",
        [("role_plan.colocate_all", "Input should be a valid boolean (got 'true')")],
    ),
    (
        "wandb-without-key",
        {"recipe": {"trainer": {"logger": "wandb"}}},
        "dev",
        [("recipe.trainer.logger", "'wandb' needs WANDB_API_KEY in the submitting environment")],
    ),
    ("version-not-calendar", {}, "v1", [("version", "'v1' is not a calendar version")]),
    ("version-bad-date", {}, "2026.9.21", [("version", "'2026.9.21' is not a calendar version")]),
]


@pytest.mark.parametrize(("changes", "version", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_experiment_is_refused_with_its_exact_errors(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    changes: dict[str, Any],
    version: str,
    expected: list[tuple[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    path = write(tmp_path, experiment(**changes))
    storage = tmp_path / "storage"
    code = main(["check", str(path), "--version", version, "--storage-root", str(storage), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 2
    assert report["ok"] is False
    found = sorted((e["field"], e["message"]) for e in report["errors"])
    assert len(found) == len(expected), found
    for (field, message), (want_field, want_message) in zip(found, sorted(expected), strict=True):
        assert field == want_field
        assert message.startswith(want_message), (message, want_message)
    assert not storage.exists(), "a refused experiment must write nothing to storage"


def test_there_are_at_least_thirty_cases() -> None:
    assert len(CASES) >= 30


def test_every_violation_says_how_to_fix_role_plan_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, experiment(**{RP + "inference_engine_data_parallel_size": 1}))
    assert main(["check", str(path), "--json"]) == 2
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert error["fix"].startswith("inference_engine_data_parallel_size=8 would consume them")


def test_unknown_keys_suggest_the_closest_field(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, experiment(**{RP + "policy_num_nodes": DELETE, RP + "polcy_num_nodes": 4}))
    assert main(["check", str(path), "--json"]) == 2
    errors = {e["field"]: e for e in json.loads(capsys.readouterr().out)["errors"]}
    assert errors["role_plan.polcy_num_nodes"]["fix"] == "did you mean 'policy_num_nodes'?"
