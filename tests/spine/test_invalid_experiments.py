"""Table of invalid experiment files: each one fails `rlbuild check` with its exact error, writes nothing."""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from datetime import date
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlbuild.cli import main
from rlbuild.core import yamlfile
from rlbuild.core.errors import CUT, MAX_FIELD, MAX_TEXT, PreflightError, Violation, quote
from rlbuild.core.yamlfile import load_yaml
from rlbuild.workflow import workflow_config
from tests.spine.experiments import DELETE, experiment, write

RP = "role_plan__"
ASYNC = "recipe__trainer__fully_async__"
TIS = {"recipe__trainer__algorithm__use_tis": True, "recipe__trainer__algorithm__tis_imp_ratio_cap": 2.0}
TINY_H64_L9 = {"source": "artifact:base_model", "revision": "tiny-qwen2-h64-l9"}
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
        [("topology.num_nodes", "Input should be greater than or equal to 1 (got 0)")],
    ),
    (
        "gpus-negative",
        {"topology__gpus_per_node": -8},
        "dev",
        [("topology.gpus_per_node", "Input should be greater than or equal to 1 (got -8)")],
    ),
    (
        "policy-nodes-zero",
        {RP + "policy_num_nodes": 0},
        "dev",
        [("role_plan.policy_num_nodes", "Input should be greater than or equal to 1 (got 0)")],
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
        {"runtime__entrypoint": "fully_async", **TIS},
        "dev",
        [("role_plan.policy_mini_batch_size", "fully_async needs train_batch_size == policy_mini_batch_size")],
    ),
    (
        "fully-async-colocated",
        {"runtime__entrypoint": "fully_async", **SEPARATE_8X8, RP + "train_batch_size": 16, **TIS},
        "dev",
        [("role_plan.colocate_all", "fully_async generates while training")],
    ),
    (
        "fully-async-without-tis",
        {"runtime__entrypoint": "fully_async", RP + "train_batch_size": 16},
        "dev",
        [("recipe.trainer.algorithm.use_tis", "runtime.entrypoint fully_async trains on samples generated by older")],
    ),
    (
        "fully-async-staleness-zero",
        {"runtime__entrypoint": "fully_async", RP + "train_batch_size": 16, **TIS, ASYNC + "max_staleness_steps": 0},
        "dev",
        [("recipe.trainer.fully_async.max_staleness_steps", "Input should be greater than or equal to 1 (got 0)")],
    ),
    (
        "staleness-bound-under-grpo",
        {ASYNC + "max_staleness_steps": 2},
        "dev",
        [("recipe.trainer.fully_async", "states {'max_staleness_steps': 2} but runtime.entrypoint is grpo")],
    ),
    (
        "entrypoint-stated-in-the-recipe",
        {"recipe__trainer__entrypoint": "fully_async"},
        "dev",
        [("recipe.trainer.entrypoint", "states 'fully_async' but runtime.entrypoint renders 'grpo'")],
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
        [("retention.temporary_storage_ttl_days", "Input should be greater than or equal to 1 (got 0)")],
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
    # Numbers out of the range every consumer accepts (checks cost nothing whatever the magnitude).
    (
        "seed-overflows-generators",
        {"seed": 2**64},
        "dev",
        [("seed", "Input should be less than or equal to 4294967295")],
    ),
    ("seed-negative", {"seed": -1}, "dev", [("seed", "Input should be greater than or equal to 0 (got -1)")]),
    ("seed-fraction", {"seed": 2.5}, "dev", [("seed", "Input should be a valid integer (got 2.5)")]),
    ("seed-boolean", {"seed": True}, "dev", [("seed", "Input should be a valid integer (got True)")]),
    ("name-too-long", {"name": "a" * 300}, "dev", [("name", "String should have at most 63 characters")]),
    ("name-upper-case", {"name": "Tiny"}, "dev", [("name", "Value error, 'Tiny' is not a path segment")]),
    ("name-empty", {"name": ""}, "dev", [("name", "String should have at least 1 character")]),
    (
        "gpus-per-node-huge",
        {"topology__gpus_per_node": 1000},
        "dev",
        [("topology.gpus_per_node", "Input should be less than or equal to 64 (got 1000)")],
    ),
    (
        "nodes-huge",
        {"topology__num_nodes": 10**9},
        "dev",
        [("topology.num_nodes", "Input should be less than or equal to 4096 (got 1000000000)")],
    ),
    (
        "gpu-variant-with-space",
        {"topology__gpu_variant": "H100 x8"},
        "dev",
        [("topology.gpu_variant", "String should match pattern")],
    ),
    (
        "train-batch-astronomical",
        {RP + "train_batch_size": 1000000000001},
        "dev",
        [("role_plan.train_batch_size", "Input should be less than or equal to 1048576 (got 1000000000001)")],
    ),
    (
        "samples-huge",
        {RP + "n_samples_per_prompt": 100000},
        "dev",
        [("role_plan.n_samples_per_prompt", "Input should be less than or equal to 4096 (got 100000)")],
    ),
    (
        "tp-zero",
        {RP + "inference_engine_tensor_parallel_size": 0},
        "dev",
        [("role_plan.inference_engine_tensor_parallel_size", "Input should be greater than or equal to 1 (got 0)")],
    ),
    (
        "ttl-a-century",
        {"retention__temporary_storage_ttl_days": 100000},
        "dev",
        [("retention.temporary_storage_ttl_days", "Input should be less than or equal to 3650 (got 100000)")],
    ),
    # Sources.
    ("model-source-empty", {"model__source": ""}, "dev", [("model.source", "String should have at least 1 character")]),
    (
        "model-source-huge",
        {"model__source": "local:" + "x" * 2000},
        "dev",
        [("model.source", "String should have at most 1024 characters")],
    ),
    ("revision-a-list", {"model__revision": ["a"]}, "dev", [("model.revision", "Input should be a valid string")]),
    ("no-train-data", {"data__train": []}, "dev", [("data.train", "List should have at least 1 item")]),
    ("no-validation-data", {"data__validation": DELETE}, "dev", [("data.validation", "is required")]),
    (
        "artifact-rule-typo",
        {"model__tokenizer__source": "artifact:base_modle"},
        "dev",
        [("model.tokenizer.source", "source artifact:base_modle: no rule of the graph named 'base_modle'")],
    ),
    (
        "hf-without-name",
        {"data__train": [{"source": "hf:acme", "revision": "a" * 40}]},
        "dev",
        [("data.train.0.source", "source 'hf:acme' is not hf:<org>/<name>")],
    ),
    (
        "local-path-missing",
        {"data__train": [{"source": "local:/no/such/rows.jsonl", "revision": "v1"}]},
        "dev",
        [("data.train.0.source", "source local:/no/such/rows.jsonl: path /no/such/rows.jsonl does not exist")],
    ),
    (
        "task-without-split",
        {"data__train": [{"source": "task:addition", "revision": "seed-0"}]},
        "dev",
        [("data.train.0.source", "source 'task:addition' is not task:<task>/<split>")],
    ),
    # Placement.
    (
        "cpu-astronomical",
        {"execution__iris__cpu": 1e9},
        "dev",
        [("execution.iris.cpu", "Input should be less than or equal to 1024 (got 1000000000.0)")],
    ),
    (
        "memory-zero",
        {"execution__iris__memory": "0GB"},
        "dev",
        [("execution.iris.memory", "Value error, '0GB' is not a size a node has")],
    ),
    (
        "disk-negative",
        {"execution__iris__disk": "-5GB"},
        "dev",
        [("execution.iris.disk", "Value error, '-5GB' is not a size")],
    ),
    (
        "retries-negative",
        {"execution__iris__max_retries": -1},
        "dev",
        [("execution.iris.max_retries", "Input should be greater than or equal to 0 (got -1)")],
    ),
    (
        "cluster-with-space",
        {"execution__iris__cluster": "my cluster"},
        "dev",
        [("execution.iris.cluster", "String should match pattern")],
    ),
    ("execution-typo", {"execution__iriss": {}}, "dev", [("execution.iriss", "unknown key")]),
    (
        "cpu-as-string",
        {"execution__iris__cpu": "4"},
        "dev",
        [("execution.iris.cpu", "Input should be a valid number (got '4')")],
    ),
    # Recipe values typed as the recipe declares them.
    (
        "eval-interval-word",
        {"recipe": {"trainer": {"eval_interval": "often"}}},
        "dev",
        [("recipe.trainer.eval_interval", "Input should be a valid integer (got 'often')")],
    ),
    (
        "max-steps-fraction",
        {"recipe": {"trainer": {"max_steps": 2.5}}},
        "dev",
        [("recipe.trainer.max_steps", "Input should be a valid integer (got 2.5)")],
    ),
    (
        "max-steps-astronomical",
        {"recipe": {"trainer": {"max_steps": 10**12}}},
        "dev",
        [("recipe.trainer.max_steps", "Input should be less than or equal to 10000000")],
    ),
    (
        "forward-batch-zero",
        {"recipe": {"trainer": {"micro_forward_batch_size_per_gpu": 0}}},
        "dev",
        [("recipe.trainer.micro_forward_batch_size_per_gpu", "Input should be greater than or equal to 1 (got 0)")],
    ),
    (
        "threads-zero",
        {"recipe": {"trainer": {"num_threads": 0}}},
        "dev",
        [("recipe.trainer.num_threads", "Input should be greater than or equal to 1 (got 0)")],
    ),
    (
        "lr-zero",
        {"recipe": {"trainer": {"policy": {"optimizer_config": {"lr": 0.0}}}}},
        "dev",
        [("recipe.trainer.policy.optimizer_config.lr", "Input should be greater than 0 (got 0.0)")],
    ),
    (
        "lr-a-word",
        {"recipe": {"trainer": {"policy": {"optimizer_config": {"lr": "fast"}}}}},
        "dev",
        [("recipe.trainer.policy.optimizer_config.lr", "Input should be a valid number (got 'fast')")],
    ),
    (
        "lr-typo",
        {"recipe": {"trainer": {"policy": {"optimizer_config": {"lrr": 0.1}}}}},
        "dev",
        [("recipe.trainer.policy.optimizer_config.lrr", "unknown key")],
    ),
    (
        "betas-one-value",
        {"recipe": {"trainer": {"policy": {"optimizer_config": {"adam_betas": [0.9]}}}}},
        "dev",
        [("recipe.trainer.policy.optimizer_config.adam_betas", "List should have at least 2 items")],
    ),
    (
        "beta-above-one",
        {"recipe": {"trainer": {"policy": {"optimizer_config": {"adam_betas": [0.9, 1.5]}}}}},
        "dev",
        [("recipe.trainer.policy.optimizer_config.adam_betas.1", "Input should be less than 1 (got 1.5)")],
    ),
    (
        "top-p-zero",
        {"recipe": {"generator": {"sampling_params": {"top_p": 0.0}}}},
        "dev",
        [("recipe.generator.sampling_params.top_p", "Input should be greater than 0 (got 0.0)")],
    ),
    (
        "top-k-negative",
        {"recipe": {"generator": {"sampling_params": {"top_k": -5}}}},
        "dev",
        [("recipe.generator.sampling_params.top_k", "Input should be greater than or equal to -1 (got -5)")],
    ),
    (
        "backend-unknown",
        {"recipe": {"generator": {"backend": "sglang"}}},
        "dev",
        [("recipe.generator.backend", "Input should be 'auto', 'vllm' or 'torch' (got 'sglang')")],
    ),
    (
        "env-class-empty",
        {"recipe": {"environment": {"env_class": ""}}},
        "dev",
        [("recipe.environment.env_class", "String should have at least 1 character")],
    ),
    (
        "trainer-section-a-list",
        {"recipe": {"trainer": [1, 2]}},
        "dev",
        [("recipe.trainer", "Input should be a valid dictionary or instance of TrainerSection")],
    ),
    ("recipe-a-string", {"recipe": "fast"}, "dev", [("recipe", "Input should be a valid dictionary (got 'fast')")]),
    (
        "interpolation",
        {"recipe": {"trainer": {"project_name": "${oc.env:HOME}"}}},
        "dev",
        [("recipe.trainer.project_name", "interpolation (${...}) is not supported")],
    ),
    (
        "kl-coefficient-negative",
        {"recipe": {"trainer": {"algorithm": {"kl_loss_coef": -0.1}}}},
        "dev",
        [("recipe.trainer.algorithm.kl_loss_coef", "Input should be greater than or equal to 0 (got -0.1)")],
    ),
    (
        "clip-above-one",
        {"recipe": {"trainer": {"algorithm": {"eps_clip_high": 1.5}}}},
        "dev",
        [("recipe.trainer.algorithm.eps_clip_high", "Input should be less than 1 (got 1.5)")],
    ),
    (
        "resume-path-without-step",
        {"recipe": {"trainer": {"resume_mode": "from_path", "resume_path": "/ckpt"}}},
        "dev",
        [("recipe.trainer.resume_path", "resume_mode=from_path needs a global_step_N folder")],
    ),
    # NaN and infinity: YAML reads `.inf` and `.nan` as floats, and no setting means either.
    (
        "kl-coefficient-infinite",
        {"recipe": {"trainer": {"algorithm": {"kl_loss_coef": float("inf")}}}},
        "dev",
        [("recipe.trainer.algorithm.kl_loss_coef", "must be a finite number (got inf)")],
    ),
    (
        "tis-cap-nan",
        {"recipe": {"trainer": {"algorithm": {"tis_imp_ratio_cap": float("nan")}}}},
        "dev",
        [("recipe.trainer.algorithm.tis_imp_ratio_cap", "must be a finite number (got nan)")],
    ),
    (
        "weight-decay-infinite",
        {"recipe": {"trainer": {"policy": {"optimizer_config": {"weight_decay": float("inf")}}}}},
        "dev",
        [("recipe.trainer.policy.optimizer_config.weight_decay", "must be a finite number (got inf)")],
    ),
    (
        "iris-cpu-minus-infinity",
        {"execution__iris__cpu": float("-inf")},
        "dev",
        [("execution.iris.cpu", "must be a finite number (got -inf)")],
    ),
    # Versions: real calendar dates, bounded suffixes.
    ("version-month-13", {}, "2026.13.40", [("version", "'2026.13.40' is not a date (month must be in 1..12)")]),
    ("version-february-30", {}, "2026.02.30", [("version", "'2026.02.30' is not a date (day is out of range")]),
    ("version-huge-suffix", {}, "2026.09.21." + "9" * 300, [("version", "'2026.09.21.99999")]),
    (
        "version-five-digit-suffix",
        {},
        "2026.09.21.12345",
        [("version", "'2026.09.21.12345' is not a calendar version")],
    ),
    ("version-dev-suffix", {}, "dev2", [("version", "'dev2' is not a calendar version")]),
    ("version-empty", {}, "", [("version", "'' is not a calendar version")]),
    ("version-shell", {}, "2026.09.21;rm -rf x", [("version", "'2026.09.21;rm -rf x' is not a calendar version")]),
    ("version-not-calendar", {}, "v1", [("version", "'v1' is not a calendar version")]),
    ("version-bad-date", {}, "2026.9.21", [("version", "'2026.9.21' is not a calendar version")]),
    # ASCII digits only: int() reads full-width and Arabic-Indic digits as the same date.
    (
        "version-full-width-digits",
        {},
        "\uff12\uff10\uff12\uff16.09.21",
        [("version", "'\uff12\uff10\uff12\uff16.09.21' is not a calendar version (it holds characters beyond ASCII")],
    ),
    (
        "version-arabic-indic-digits",
        {},
        "\u0662\u0660\u0662\u0666.\u0660\u0669.\u0662\u0661",
        [("version", "'\u0662\u0660\u0662\u0666.\u0660\u0669.\u0662\u0661' is not a calendar version")],
    ),
    ("version-trailing-newline", {}, "2026.09.21\n", [("version", "'2026.09.21\\n' is not a calendar version")]),
    # The label of a built-in model is what is built: one that names no variant would build another under its name.
    (
        "base-model-revision-names-no-variant",
        {"model": {**TINY_H64_L9, "tokenizer": TINY_H64_L9}},
        "dev",
        [
            ("model.revision", "'tiny-qwen2-h64-l9' names no tiny model variant of artifact:base_model"),
            ("model.tokenizer.revision", "'tiny-qwen2-h64-l9' names no tiny model variant of artifact:base_model"),
        ],
    ),
    # Known at plan time, not minutes later at train start: NCCL carries GPU tensors only.
    (
        "nccl-on-cpu-ranks",
        {"topology__gpu_variant": "cpu", "recipe": {"generator": {"weight_sync_backend": "nccl"}}},
        "dev",
        [("recipe.generator.weight_sync_backend", "'nccl' needs GPUs, and topology.gpu_variant cpu runs the policy")],
    ),
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
    assert_refused(path, version, expected, tmp_path / "storage", capsys)


def assert_refused(
    path: Path, version: str, expected: list[tuple[str, str]], storage: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`rlbuild check` refuses `path` with exactly the `expected` (field, message start) errors, each with a fix,
    quickly whatever the numbers in it, and writes nothing."""
    started = time.monotonic()
    code = main(["check", str(path), "--version", version, "--storage-root", str(storage), "--json"])
    assert time.monotonic() - started < 5  # generous on a loaded machine; a magnitude-sized loop takes minutes
    report = json.loads(capsys.readouterr().out)
    assert code == 2
    assert report["ok"] is False
    found = sorted((e["field"], e["message"]) for e in report["errors"])
    assert len(found) == len(expected), found
    for (field, message), (want_field, want_message) in zip(found, sorted(expected), strict=True):
        assert field == want_field
        assert message.startswith(want_message), (message, want_message)
    assert not storage.exists(), "a refused experiment must write nothing to storage"


def alias_bomb(levels: int = 9) -> bytes:
    """An `execution.env` value in which each anchor lists the one before ten times: 10**levels values written
    in a few hundred bytes (it took 1.4 GB and printed a 351 MB error)."""
    lines = ["name: a", "execution:", "  env:", "    A: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"    B{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return "\n".join(lines).encode() + b"\n"


NOT_TEXT = "is read by YAML as"
# (id, the file's bytes, [(field, message start)]): problems with the file itself.
FILE_CASES: list[tuple[str, bytes, list[tuple[str, str]]]] = [
    # Bounds: each refused in one line, whatever the input's size (rlbuild/core/yamlfile.py).
    ("nested-10000-deep", b"name: " + b"[" * 10_000 + b"\n", [("experiment", "nests deeper than 64 levels at line 1")]),
    (
        "nested-past-the-bound",
        b"recipe:\n  x: " + b"[" * 100 + b"]" * 100 + b"\n",
        [("experiment", "nests deeper than 64 levels at line 2")],
    ),
    ("alias-bomb", alias_bomb(), [("experiment", "expands to more than 100,000 values through its aliases (`*name`)")]),
    ("alias-inside-its-anchor", b"recipe:\n  x: &a [*a]\n", [("experiment", "has an alias *a inside its own anchor")]),
    (
        "env-key-of-5000-characters",
        b"execution:\n  env:\n    " + b"K" * 5000 + b": v\n",
        [("experiment", "has a key of 5,000 characters at line 3, column 5005; YAML reads keys of at most 1024")],
    ),
    # Keys YAML reads as other types, named as written.
    (
        "keys-that-are-not-text",
        b"arms:\n  2026-09-21: {seed: 1}\n  on: {seed: 2}\n  12: {seed: 3}\n  null: {seed: 4}\n",
        [
            ("arms.2026-09-21", f"the key 2026-09-21 {NOT_TEXT} a date, not as the text '2026-09-21'"),
            ("arms.on", f"the key on {NOT_TEXT} true/false, not as the text 'on'"),
            ("arms.12", f"the key 12 {NOT_TEXT} a number"),
            ("arms.null", f"the key null {NOT_TEXT} null (no value)"),
        ],
    ),
    ("duplicate-key", b"name: a\nseed: 1\nseed: 2\n", [("experiment", "key 'seed' is given twice (lines 2 and 3)")]),
    ("not-utf8", b"name: caf\xe9\n", [("experiment", "is not UTF-8 text (byte 0xe9 on line 1)")]),
    ("empty", b"\n  \n", [("experiment", "is empty")]),
    ("a-list", b"- name: a\n", [("<root>", "must be a mapping of the experiment's fields")]),
    ("unclosed-bracket", b"name: [a\n", [("experiment", "is not valid YAML at line 2")]),
    (
        "control-character",
        b"name: a\nseed: \x07\n",
        [("experiment", "is not valid YAML at line 2: unacceptable character #x0007")],
    ),
    ("tab-indented", b"role_plan:\n\tcolocate_all: true\n", [("experiment", "is not valid YAML at line 2")]),
    (
        "merge-a-scalar",
        b"model:\n  <<: 5\n",
        [("experiment", "has a merge key (`<<`) at line 2, column 7 that cannot")],
    ),
    (
        "merge-itself",
        b"model: &m\n  <<: *m\n",
        [("experiment", "has a merge key (`<<`) at line 1, column 8 that cannot")],
    ),
    (
        "duplicate-beside-a-merge",
        b"a: &a {x: 1}\nb:\n  <<: *a\n  y: 1\n  y: 2\n",
        [("experiment", "key 'y' is given twice (lines 4 and 5)")],
    ),
]


@pytest.mark.parametrize(("content", "expected"), [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES])
def test_a_bad_file_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes, expected: list[tuple[str, str]]
) -> None:
    path = tmp_path / "exp.yaml"
    path.write_bytes(content)
    assert_refused(path, "dev", expected, tmp_path / "storage", capsys)


def test_a_key_that_is_not_text_is_named_with_its_quoting(tmp_path: Path) -> None:
    path = tmp_path / "exp.yaml"
    path.write_bytes(b"arms:\n  - {2026-09-21: 1}\n")
    with pytest.raises(PreflightError) as info:
        load_yaml(path, "experiment")
    (violation,) = info.value.violations
    assert violation.field == "arms.0.2026-09-21"
    assert violation.fix == "quote it: '2026-09-21':"


def test_a_value_yaml_reads_as_another_type_says_to_quote_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, experiment(name=True, model__revision=date(2026, 9, 21)))
    assert main(["check", str(path), "--json"]) == 2
    fixes = {e["field"]: e["fix"] for e in json.loads(capsys.readouterr().out)["errors"]}
    assert fixes["name"] == "quote it in the file: YAML reads this unquoted value as true/false, not as text"
    assert fixes["model.revision"] == "quote it in the file: YAML reads this unquoted value as a date, not as text"


def test_a_document_of_more_values_than_the_bound_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Values written out count too (a bound of 100,000 takes a 200 KB file; a bound of 50 shows the same)."""
    monkeypatch.setattr(yamlfile, "MAX_NODES", 50)
    path = tmp_path / "exp.yaml"
    path.write_text("recipe:\n  x: [" + ", ".join(["1"] * 60) + "]\n")
    with pytest.raises(PreflightError) as info:
        load_yaml(path, "experiment")
    (violation,) = info.value.violations
    assert violation.message.startswith("holds more than 50 values at line 2")


def test_hostile_files_are_refused_in_bounded_time_memory_and_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each in one line, well within 5 s and 200 MB on a loaded machine (they took minutes and gigabytes)."""
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as f:
        f.truncate(50 * 1024 * 1024)  # 50 MB without writing them: a sparse file
    files = {"huge": huge}
    for name, content in (("nested", FILE_CASES[0][1]), ("bomb", alias_bomb()), ("key", FILE_CASES[4][1])):
        files[name] = tmp_path / f"{name}.yaml"
        files[name].write_bytes(content)
    said = {}
    for name, path in files.items():
        tracemalloc.start()
        started = time.monotonic()
        code = main(["check", str(path), "--version", "dev", "--storage-root", str(tmp_path / "s")])
        seconds, (_, peak) = time.monotonic() - started, tracemalloc.get_traced_memory()
        tracemalloc.stop()
        out = capsys.readouterr()
        with capsys.disabled():  # the figures, for whoever runs it with -s
            print(f"{name}: {seconds:.2f} s, {peak / 2**20:.1f} MiB peak, {len(out.err)} characters")
        assert code == 2 and seconds < 5 and peak < 200 * 2**20, (name, seconds, peak)
        lines = out.err.strip().splitlines()
        assert len(lines) == 2 and "1 problem(s)" in lines[0] and len(lines[1]) < 400, (name, lines)
        said[name] = lines[1]
    assert said["huge"].startswith("  - experiment: is 52,428,800 bytes, over the 262,144-byte (256 KiB) bound")


def test_an_error_never_grows_with_the_input() -> None:
    """Fields, messages and fixes are cut (with a marker), quoted values are bounded before they are written out,
    and an error lists 50 problems then a count."""
    huge = Violation("f" * 10**6, "m" * 10**6, "x" * 10**6)
    assert len(huge.field) == MAX_FIELD and len(huge.message) == len(huge.fix) == MAX_TEXT
    assert huge.message.endswith(CUT)
    nested: list[Any] = ["x"] * 10
    for _ in range(9):
        nested = [nested] * 10  # 10**10 values by reference: repr() would not finish
    started = time.monotonic()
    assert len(quote(nested)) <= 80 and time.monotonic() - started < 1
    assert quote("y" * 10**6) == repr("y" * 80) + "... (1000000 characters)"
    error = PreflightError("exp.yaml", [Violation(f"k{i}", "unknown key") for i in range(1000)])
    lines = str(error).splitlines()
    assert len(lines) == 52 and lines[-1] == "  - ...: 950 more problem(s) not listed; fix those above and check again"
    assert len(error.violations) == 1000


def test_local_data_without_rows_is_refused_at_plan_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Staging would refuse each minutes later; read cheaply now (a JSONL file to its first row, a parquet
    file's footer). A file with a row passes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    blank, folder, no_data, csv, parquet, rows = (
        tmp_path / n for n in ("b.jsonl", "d", "n", "r.csv", "e.parquet", "r")
    )
    blank.write_text("\n  \n")
    folder.mkdir()
    (folder / "a.jsonl").write_text("")
    (folder / "b.jsonl").write_text("\n")
    no_data.mkdir()
    (no_data / "notes.txt").write_text("prompt,answer\n")
    csv.write_text("prompt,answer\n1+1,2\n")
    pq.write_table(pa.table({"prompt": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), parquet)
    rows.mkdir()
    (rows / "a.jsonl").write_text("")
    (rows / "b.jsonl").write_text('{"prompt": "1+1", "answer": "2"}\n')
    train = [{"source": f"local:{p}", "revision": "r1"} for p in (blank, folder, no_data, csv, rows)]
    path = write(
        tmp_path, experiment(data__train=train, data__validation=[{"source": f"local:{parquet}", "revision": "r1"}])
    )
    zero = "holds 0 rows"
    expected = [
        ("data.train.0.source", f"source local:{blank}: {blank} {zero} (the file is empty or blank lines)"),
        (
            "data.train.1.source",
            f"source local:{folder}: {folder} {zero} (its 2 data file(s) are empty or blank lines)",
        ),
        ("data.train.2.source", f"source local:{no_data}: {no_data} holds no .jsonl or .parquet files"),
        ("data.train.3.source", f"source local:{csv}: {csv}: data files must be .jsonl or .parquet"),
        ("data.validation.0.source", f"source local:{parquet}: {parquet} {zero} (the file is empty"),
    ]
    assert_refused(path, "dev", expected, tmp_path / "s", capsys)


def test_a_directory_or_a_missing_file_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert_refused(tmp_path, "dev", [("experiment", f"{tmp_path} is a directory")], tmp_path / "s", capsys)
    missing = tmp_path / "nope.yaml"
    assert_refused(missing, "dev", [("experiment", "file not found")], tmp_path / "s", capsys)


def test_a_path_that_is_not_a_readable_file_is_one_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop, other = tmp_path / "loop.yaml", tmp_path / "other.yaml"
    loop.symlink_to(other)
    other.symlink_to(loop)
    assert_refused(loop, "dev", [("experiment", f"{loop} is a symlink loop")], tmp_path / "s", capsys)
    dangling = tmp_path / "dangling.yaml"
    dangling.symlink_to(tmp_path / "gone.yaml")
    expected = f"{dangling} is a link to {tmp_path / 'gone.yaml'}, which does not exist"
    assert_refused(dangling, "dev", [("experiment", expected)], tmp_path / "s", capsys)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)  # reading it would block forever
    assert_refused(fifo, "dev", [("experiment", f"{fifo} is a FIFO (named pipe), not a file")], tmp_path / "s", capsys)


def test_a_local_source_with_path_problems_is_one_line_per_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "broken").symlink_to(tmp_path / "nowhere")
    (model / "sub" / "a").symlink_to(model / "sub" / "b")
    (model / "sub" / "b").symlink_to(model / "sub" / "a")
    os.mkfifo(model / "pipe")
    data = tmp_path / "loop.jsonl"
    data.symlink_to(data)
    local = {"source": f"local:{model}", "revision": "r1"}
    path = write(
        tmp_path, experiment(model={**local, "tokenizer": local}, data__train=[{**local, "source": f"local:{data}"}])
    )
    inside = (
        f"in {model}, broken is a link to {tmp_path / 'nowhere'}, which does not exist; pipe is a FIFO (named pipe), "
        "not a file or folder; sub/a is a symlink loop (its links lead back to themselves); and 1 more; fix or remove"
    )
    expected = [
        ("model.source", f"source local:{model}: {inside}"),
        ("model.tokenizer.source", f"source local:{model}: {inside}"),
        ("data.train.0.source", f"source local:{data}: {data} is a symlink loop"),
    ]
    assert_refused(path, "dev", expected, tmp_path / "s", capsys)


def test_yaml_merge_keys_merge_as_the_spec_says(tmp_path: Path) -> None:
    """`<<: *base` brings a mapping's keys in, a key beside it wins, also through a merge of a merge (where PyYAML
    6.0 alone lets the deepest one win), and earlier aliases of a list win over later ones."""
    text = "base: &b {a: 1, b: 1}\nmid: &m\n  <<: *b\n  a: 2\nx:\n  <<: [*m, {c: 3, a: 9}]\n  b: 4\n"
    (tmp_path / "m.yaml").write_text(text)
    loaded = load_yaml(tmp_path / "m.yaml", "experiment")
    assert loaded["mid"] == {"a": 2, "b": 1}
    assert loaded["x"] == {"a": 2, "b": 4, "c": 3}


def test_an_experiment_written_with_merge_keys_checks_like_the_expanded_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    expanded = write(tmp_path, experiment(), "expanded.yaml")
    doc = experiment()
    model = yaml.safe_dump({"model": doc.pop("model")}, sort_keys=False).replace("model:", "model: &model", 1)
    rest = yaml.safe_dump(doc, sort_keys=False).replace(
        "validation:\n  - source: task:addition/validation\n    revision: seed-0",
        "validation:\n  - {<<: *train, source: 'task:addition/validation'}",
    )
    rest = rest.replace("train:\n  - source", "train:\n  - &train\n    source")
    merged = tmp_path / "merged.yaml"
    merged.write_text(model + rest)
    assert "<<: *train" in merged.read_text()
    plans = []
    for path in (expanded, merged):
        code = main(["check", str(path), "--version", "dev", "--storage-root", str(tmp_path / "s"), "--json"])
        report = json.loads(capsys.readouterr().out)
        assert code == 0, report["errors"]
        plans.append(report["plans"]["dev"]["artifacts"])
    assert plans[0] == plans[1]


def test_a_secret_in_an_experiment_is_refused_without_printing_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "wandb-0123456789abcdef-secret"
    monkeypatch.setenv("WANDB_API_KEY", secret)
    path = write(tmp_path, experiment(recipe={"trainer": {"project_name": f"team-{secret}"}}))
    expected = [("recipe.trainer.project_name", "holds the value of the secret environment variable WANDB_API_KEY")]
    code = main(["check", str(path), "--version", "dev", "--storage-root", str(tmp_path / "s")])
    captured = capsys.readouterr()
    assert code == 2 and secret not in captured.out + captured.err
    assert_refused(path, "dev", expected, tmp_path / "s", capsys)


# (id, workflow config, field, message start): `--config` and config/config.yaml.
CONFIG_CASES: list[tuple[str, dict[str, Any], str, str]] = [
    ("key-typo", {"verions": ["2026.09.21"]}, "config.verions", "unknown key"),
    ("no-versions", {"versions": []}, "config.versions", "List should have at least 1 item"),
    ("version-not-a-date", {"versions": ["2026.13.40"]}, "config.versions[0]", "'2026.13.40' is not a date"),
    ("empty-storage-root", {"storage_root": ""}, "config.storage_root", "String should have at least 1 character"),
    ("retrain-maybe", {"allow_retrain": "maybe"}, "config.allow_retrain", "Input should be a valid boolean"),
    ("experiment-a-number", {"experiment": 5}, "config.experiment", "Input should be a valid string"),
]


@pytest.mark.parametrize(
    ("change", "field", "message"), [c[1:] for c in CONFIG_CASES], ids=[c[0] for c in CONFIG_CASES]
)
def test_a_bad_workflow_config_is_refused_naming_the_key(change: dict[str, Any], field: str, message: str) -> None:
    config = {"experiment": "tiny-addition", "versions": ["2026.09.21"], "storage_root": "results", **change}
    with pytest.raises(PreflightError) as info:
        workflow_config(config)
    (violation,) = info.value.violations
    assert violation.field == field and violation.message.startswith(message), violation


def test_there_are_at_least_eighty_bad_inputs() -> None:
    assert len(CASES) + len(FILE_CASES) + len(CONFIG_CASES) + 3 >= 80


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


def test_every_section_s_errors_come_at_once(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A role-plan typo, a recipe typo and a bad execution value in one file: all three in one run."""
    doc = experiment(**{RP + "policy_num_nodes": DELETE, RP + "polcy_num_nodes": 4})
    doc.setdefault("recipe", {}).setdefault("trainer", {})["max_step"] = 10
    doc.setdefault("execution", {}).setdefault("iris", {})["priority"] = "urgentt"
    assert main(["check", str(write(tmp_path, doc)), "--json"]) == 2
    fields = {e["field"] for e in json.loads(capsys.readouterr().out)["errors"]}
    assert {"role_plan.polcy_num_nodes", "recipe.trainer.max_step", "execution.iris.priority"} <= fields
