"""The trainer recipe: composed once with OmegaConf against `config/trainer/base.yaml`, role plan rendered in.

The base recipe is the schema: a key it does not have is an error. Values the role plan owns may be stated
in a recipe only with the same value and type; they are materialised from the plan either way.
"""

from __future__ import annotations

import difflib
from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from rlbuild.errors import Violation
from rlbuild.identity import flatten
from rlbuild.spec import Experiment

BASE_RECIPE = Path(__file__).resolve().parent.parent / "config" / "trainer" / "base.yaml"

# Strategies this runtime can execute, and the package that would provide the others.
INSTALLED_STRATEGIES = {"fsdp2"}
STRATEGY_PROVIDERS = {"megatron": "megatron-core"}

CHOICES: dict[str, tuple[str, ...]] = {
    "trainer.resume_mode": ("latest", "none", "from_path"),
    "trainer.logger": ("console", "wandb"),
    "trainer.policy.optimizer_config.scheduler": ("constant_with_warmup", "cosine_with_warmup"),
    "trainer.algorithm.advantage_estimator": ("grpo",),
    "trainer.algorithm.kl_estimator_type": ("k3",),
    "trainer.algorithm.policy_loss_type": ("regular", "dual_clip"),
    "trainer.algorithm.loss_reduction": ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean"),
    "generator.backend": ("auto", "vllm", "torch"),
    "generator.weight_sync_backend": ("gloo", "nccl"),
}


def role_plan_values(experiment: Experiment) -> dict[str, Any]:
    """The recipe keys the role plan, runtime and seed own, with the values they render."""
    plan = experiment.role_plan
    return {
        "trainer.strategy": experiment.runtime.strategy,
        "trainer.seed": experiment.seed,
        "trainer.placement.colocate_all": plan.colocate_all,
        "trainer.placement.colocate_policy_ref": plan.ref_num_nodes == 0,
        "trainer.placement.policy_num_nodes": plan.policy_num_nodes,
        "trainer.placement.policy_num_gpus_per_node": plan.policy_num_gpus_per_node,
        "trainer.placement.ref_num_nodes": plan.ref_num_nodes or plan.policy_num_nodes,
        "trainer.placement.ref_num_gpus_per_node": plan.policy_num_gpus_per_node,
        "trainer.train_batch_size": plan.train_batch_size,
        "trainer.policy_mini_batch_size": plan.policy_mini_batch_size,
        "trainer.micro_train_batch_size_per_gpu": plan.micro_train_batch_size_per_gpu,
        "generator.num_inference_engines": plan.num_inference_engines,
        "generator.inference_engine_tensor_parallel_size": plan.inference_engine_tensor_parallel_size,
        "generator.inference_engine_pipeline_parallel_size": plan.inference_engine_pipeline_parallel_size,
        "generator.inference_engine_data_parallel_size": plan.inference_engine_data_parallel_size,
        "generator.inference_engine_expert_parallel_size": plan.inference_engine_expert_parallel_size,
        "generator.n_samples_per_prompt": plan.n_samples_per_prompt,
    }


@cache
def _base(path: Path) -> dict[str, Any]:
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)  # type: ignore[return-value]


def _unknown_keys(user: dict[str, Any], base: dict[str, Any], prefix: str = "recipe.") -> list[Violation]:
    out: list[Violation] = []
    for key, value in user.items():
        path = f"{prefix}{key}"
        if not isinstance(base, dict) or key not in base:
            known = sorted(base) if isinstance(base, dict) else []
            close = difflib.get_close_matches(str(key), known, n=1)
            fix = (
                f"did you mean '{close[0]}'?" if close else "the base recipe (config/trainer/base.yaml) has no such key"
            )
            out.append(Violation(path, "unknown key", fix))
        elif isinstance(value, dict) and isinstance(base[key], dict):
            out += _unknown_keys(value, base[key], f"{path}.")
        elif isinstance(value, dict) != isinstance(base[key], dict):
            expected = "a mapping" if isinstance(base[key], dict) else "a value"
            out.append(Violation(path, f"must be {expected}, got {value!r}"))
    return out


def compose_recipe(experiment: Experiment, base_path: Path = BASE_RECIPE) -> tuple[dict[str, Any], list[Violation]]:
    """Compose base + experiment recipe, render the role plan into it, and check it against the plan."""
    base = _base(base_path)
    violations = _unknown_keys(experiment.recipe, base)
    if violations:
        return {}, violations
    merged = OmegaConf.merge(OmegaConf.create(base), OmegaConf.create(experiment.recipe))
    stated = flatten(experiment.recipe)
    for key, plan_value in role_plan_values(experiment).items():
        if key in stated:
            value = stated[key]
            if type(value) is not type(plan_value) or value != plan_value:
                owner = (
                    "runtime.strategy"
                    if key == "trainer.strategy"
                    else "seed"
                    if key == "trainer.seed"
                    else ("role_plan")
                )
                violations.append(
                    Violation(
                        f"recipe.{key}",
                        f"states {value!r} but {owner} renders {plan_value!r}",
                        f"delete it from the recipe; {owner} is the single source of this value",
                    )
                )
        OmegaConf.update(merged, key, plan_value, merge=False)
    recipe: dict[str, Any] = OmegaConf.to_container(merged, resolve=True)  # type: ignore[assignment]
    violations += check_recipe_values(recipe)
    return recipe, violations


def check_recipe_values(recipe: dict[str, Any]) -> list[Violation]:
    """Checks of recipe values that are deterministic from the document alone."""
    flat = flatten(recipe)
    out: list[Violation] = []
    for key, allowed in CHOICES.items():
        if flat.get(key) not in allowed:
            out.append(Violation(f"recipe.{key}", f"{flat.get(key)!r} is not supported", f"use one of {allowed}"))
    strategy = flat["trainer.strategy"]
    if strategy not in INSTALLED_STRATEGIES:
        out.append(
            Violation(
                "runtime.strategy",
                f"{strategy!r}: this runtime installs no {STRATEGY_PROVIDERS.get(strategy, strategy)} backend "
                "(not in uv.lock), so the job would fail after GPUs are allocated",
                f"use one of {sorted(INSTALLED_STRATEGIES)}, or pin a runtime that provides it",
            )
        )
    positive = [
        "trainer.max_steps",
        "trainer.ckpt_interval",
        "trainer.update_epochs_per_batch",
        "trainer.policy.optimizer_config.lr",
        "trainer.policy.optimizer_config.max_grad_norm",
        "generator.max_prompt_length",
        "generator.sampling_params.max_generate_length",
        "generator.eval_sampling_params.max_generate_length",
    ]
    for key in positive:
        value = flat.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            out.append(Violation(f"recipe.{key}", f"must be a positive number, got {value!r}"))
    temperature = flat.get("generator.sampling_params.temperature")
    if not isinstance(temperature, int | float) or temperature <= 0:
        out.append(
            Violation(
                "recipe.generator.sampling_params.temperature",
                f"must be > 0 for GRPO rollouts (got {temperature!r}); greedy rollouts give every sample of a "
                "group the same answer and zero advantage",
                "use 1.0",
            )
        )
    top_p = flat.get("generator.sampling_params.top_p")
    if not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        out.append(Violation("recipe.generator.sampling_params.top_p", f"must be in (0, 1], got {top_p!r}"))
    for key in ("trainer.algorithm.eps_clip_low", "trainer.algorithm.eps_clip_high"):
        value = flat.get(key)
        if not isinstance(value, int | float) or not 0 < value < 1:
            out.append(Violation(f"recipe.{key}", f"must be in (0, 1), got {value!r}"))
    if (
        flat.get("trainer.algorithm.policy_loss_type") == "dual_clip"
        and not flat.get("trainer.algorithm.clip_ratio_c", 0) > 1
    ):
        out.append(Violation("recipe.trainer.algorithm.clip_ratio_c", "dual_clip needs clip_ratio_c > 1", "use 3.0"))
    if flat.get("trainer.algorithm.use_tis") and not flat.get("trainer.algorithm.tis_imp_ratio_cap", 0) > 0:
        out.append(
            Violation(
                "recipe.trainer.algorithm.tis_imp_ratio_cap",
                f"use_tis=true needs a positive cap, got {flat.get('trainer.algorithm.tis_imp_ratio_cap')!r}",
                "set tis_imp_ratio_cap: 2.0",
            )
        )
    if flat.get("trainer.resume_mode") == "from_path" and "global_step_" not in str(flat.get("trainer.resume_path")):
        out.append(
            Violation(
                "recipe.trainer.resume_path",
                f"resume_mode=from_path needs a global_step_N folder, got {flat.get('trainer.resume_path')!r}",
                "point resume_path at .../checkpoints/global_step_N",
            )
        )
    return out
