"""The trainer recipe, typed: every key the trainer reads, its type, range, default and meaning.

This model is the recipe's one schema. An experiment's `recipe:` is a partial mapping validated against it
(unknown keys, wrong types and out-of-range values are errors naming the key); the launch document carries the
whole recipe, and the trainer parses it once and reads attributes. Adding a key means adding a field here and
reading it where the behaviour lives. Key names follow SkyRL 0.3.1 (`trainer.*`, `generator.*`).

Keys marked (role plan) are rendered from the experiment's role plan, runtime and seed; a recipe may state them
only with the same value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from rlbuild.core.errors import Violation
from rlbuild.core.validation import StrictModel


def _plan(description: str) -> str:
    return f"(role plan) {description}"


class Placement(StrictModel):
    colocate_all: bool = Field(True, description=_plan("policy, reference and engines share the same GPUs"))
    colocate_policy_ref: bool = Field(True, description=_plan("the reference lives in the policy workers"))
    policy_num_nodes: int = Field(1, ge=1, description=_plan("nodes of the policy"))
    policy_num_gpus_per_node: int = Field(1, ge=1, description=_plan("GPUs per policy node"))
    ref_num_nodes: int = Field(1, ge=1, description=_plan("nodes of a separate reference"))
    ref_num_gpus_per_node: int = Field(1, ge=1, description=_plan("GPUs per reference node"))

    @property
    def policy_world_size(self) -> int:
        return self.policy_num_nodes * self.policy_num_gpus_per_node


class OptimizerConfig(StrictModel):
    lr: float = Field(3.0e-4, gt=0, le=1, description="peak learning rate of AdamW")
    adam_betas: list[Annotated[float, Field(ge=0, lt=1)]] = Field(
        [0.9, 0.99], min_length=2, max_length=2, description="AdamW [beta1, beta2], each in [0, 1)"
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay")
    max_grad_norm: float = Field(1.0, gt=0, description="gradients are clipped to this global L2 norm")
    num_warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warmup from 0 to lr")
    scheduler: Literal["constant_with_warmup", "cosine_with_warmup"] = Field(
        "constant_with_warmup", description="after warmup: constant, or cosine decay to min_lr_ratio x lr at max_steps"
    )
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="the cosine schedule's final lr as a fraction of lr")


class Policy(StrictModel):
    optimizer_config: OptimizerConfig = Field(default_factory=OptimizerConfig, description="the policy's optimizer")


class DynamicSampling(StrictModel):
    type: Literal["filter"] | None = Field(
        None,
        description="null: one batch of prompts a step. filter: draw up to max_sample_batches batches until "
        "train_batch_size groups carry signal (rewards that differ), train on those first, top up with the rest "
        "(DAPO's dynamic sampling, bounded; trainer/sampling.py)",
    )
    max_sample_batches: int = Field(
        30, ge=1, le=1000, description="with type filter: sample batches a step may draw at most (SkyRL's default 30)"
    )


class Algorithm(StrictModel):
    advantage_estimator: Literal["grpo"] = Field("grpo", description="group-relative advantages (GRPO)")
    grpo_norm_by_std: bool = Field(True, description="divide advantages by the group's std (false: Dr. GRPO)")
    advantage_eps: float = Field(
        1.0e-6, ge=0, le=1, description="added to the group's std before dividing (SkyRL 1e-6; TRL's fixed 1e-4)"
    )
    zero_variance_filter: bool = Field(
        False,
        description="train only on groups whose rewards differ (faster; drops their KL term; under seq_mean_* "
        "reductions each kept sequence then weighs n_all / n_kept more, a larger step)",
    )
    dynamic_sampling: DynamicSampling = Field(
        default_factory=DynamicSampling, description="sample more prompts when few groups carry signal"
    )
    use_kl_loss: bool = Field(True, description="add kl_loss_coef x KL(policy || reference) to the loss")
    kl_loss_coef: float = Field(0.04, ge=0, description="weight of the KL term")
    kl_estimator_type: Literal["k3"] = Field("k3", description="per-token KL estimator")
    use_entropy_loss: bool = Field(False, description="subtract entropy_loss_coef x entropy from the loss")
    entropy_loss_coef: float = Field(0.01, ge=0, description="weight of the entropy bonus")
    policy_loss_type: Literal["regular", "dual_clip"] = Field("regular", description="clipped surrogate variant")
    loss_reduction: Literal["token_mean", "seq_mean_token_sum", "seq_mean_token_mean"] = Field(
        "seq_mean_token_mean", description="how per-token losses reduce over each optimizer mini-batch"
    )
    eps_clip_low: float = Field(0.2, gt=0, lt=1, description="ratio clip below 1 - eps_clip_low")
    eps_clip_high: float = Field(0.2, gt=0, lt=1, description="ratio clip above 1 + eps_clip_high")
    clip_ratio_c: float = Field(3.0, gt=1, description="dual_clip's bound on the loss of negative advantages")
    use_tis: bool = Field(False, description="truncated importance sampling from rollout to trainer logprobs")
    tis_imp_ratio_cap: float = Field(-1.0, description="TIS weight cap; must be > 0 when use_tis is true")


class FullyAsync(StrictModel):
    """The asynchronous loop's bound (`runtime.entrypoint: fully_async`; SkyRL's `trainer.fully_async`)."""

    max_staleness_steps: int = Field(
        1,
        ge=1,
        le=64,
        description="a sample trains at most this many policy versions after the one that generated it; "
        "generation for a step that would be older never starts",
    )


class TrainerSection(StrictModel):
    entrypoint: Literal["grpo", "fully_async"] = Field(
        "grpo",
        description="(runtime.entrypoint) the loop: grpo samples each step with the last step's weights; "
        "fully_async generates ahead while the policy trains (trainer/sampling.py)",
    )
    fully_async: FullyAsync = Field(default_factory=FullyAsync, description="the asynchronous loop's bound")
    strategy: Literal["fsdp2", "megatron"] = Field("fsdp2", description="(runtime.strategy) policy sharding")
    seed: int = Field(42, ge=0, lt=2**32, description="(seed) every random choice derives from it and the step")
    placement: Placement = Field(default_factory=Placement, description="where roles run")
    train_batch_size: int = Field(16, ge=1, description=_plan("prompts per global step"))
    policy_mini_batch_size: int = Field(16, ge=1, description=_plan("prompts per optimizer step"))
    micro_train_batch_size_per_gpu: int = Field(16, ge=1, description=_plan("samples per forward/backward"))
    micro_forward_batch_size_per_gpu: int = Field(256, ge=1, description="samples per no-grad scoring forward")
    update_epochs_per_batch: int = Field(2, ge=1, le=100, description="optimisation passes over each rollout batch")
    max_steps: int = Field(200, ge=1, le=10_000_000, description="global steps of training")
    ckpt_interval: int = Field(10, ge=1, description="global steps between checkpoints (and at the last step)")
    resume_mode: Literal["latest", "none", "from_path"] = Field(
        "latest", description="latest: the newest checkpoint of this run; none: step 0; from_path: resume_path"
    )
    resume_path: str | None = Field(None, description="a global_step_N folder, for resume_mode from_path")
    eval_interval: int = Field(25, ge=-1, description="global steps between held-out evals; -1 disables")
    eval_before_train: bool = Field(True, description="score the held-out set before the first step")
    zero_reward_warning_steps: int = Field(
        20, ge=0, description="warn when every reward was 0 for this many consecutive steps (no signal); 0: never"
    )
    logger: Literal["console", "wandb"] = Field("console", description="where metrics go besides metrics.jsonl")
    project_name: str = Field("rlbuild", min_length=1, max_length=128, description="the W&B project")
    num_threads: int = Field(1, ge=1, le=1024, description="torch intra-op threads per actor on CPU")
    policy: Policy = Field(default_factory=Policy, description="the policy model's training settings")
    algorithm: Algorithm = Field(default_factory=Algorithm, description="the GRPO objective")

    def loop(self) -> str:
        """The training loop as the plan and the model card state it (trainer/sampling.py runs it)."""
        if self.entrypoint == "fully_async":
            bound = self.fully_async.max_staleness_steps
            return (
                f"asynchronous (fully_async): generation overlaps training; a sample trains at most {bound} policy "
                f"version(s) after its own, corrected by TIS (cap {self.algorithm.tis_imp_ratio_cap:g})"
            )
        return "synchronous (grpo): each step samples with the weights of the step before"


class SamplingParams(StrictModel):
    max_generate_length: int = Field(4, ge=1, le=1_000_000, description="tokens generated per completion at most")
    temperature: float = Field(1.0, ge=0, le=100, description="sampling temperature; 0 is greedy")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass")
    top_k: int = Field(-1, ge=-1, description="sample among the k most likely tokens; -1 disables")


class GeneratorSection(StrictModel):
    backend: Literal["auto", "vllm", "torch"] = Field(
        "auto", description="rollout engine: vllm, torch (HF generate with a KV cache), auto: vllm on GPUs"
    )
    num_inference_engines: int = Field(1, ge=1, description=_plan("rollout engines"))
    inference_engine_tensor_parallel_size: int = Field(1, ge=1, description=_plan("TP of one engine"))
    inference_engine_pipeline_parallel_size: int = Field(1, ge=1, description=_plan("PP of one engine"))
    inference_engine_data_parallel_size: int = Field(1, ge=1, description=_plan("DP of one engine"))
    inference_engine_expert_parallel_size: int = Field(1, ge=1, description=_plan("EP of one engine"))
    n_samples_per_prompt: int = Field(16, ge=1, description=_plan("samples per prompt: the GRPO group size"))
    weight_sync_backend: Literal["gloo", "nccl"] = Field("gloo", description="policy -> engine broadcast group")
    weight_sync_check_tolerance: float = Field(
        1.0e-4, gt=0, description="max |engine - policy| logprob on a fixed sequence after each sync"
    )
    gpu_memory_utilization: float = Field(0.8, gt=0, le=1, description="vLLM's share of GPU memory")
    enforce_eager: bool = Field(True, description="vLLM without CUDA graphs")
    max_prompt_length: int = Field(32, ge=1, le=10_000_000, description="prompts longer than this are dropped")
    sampling_params: SamplingParams = Field(default_factory=SamplingParams, description="rollout sampling")
    eval_sampling_params: SamplingParams = Field(
        default_factory=lambda: SamplingParams(temperature=0.0), description="held-out eval sampling (greedy)"
    )


@dataclass(frozen=True)
class SandboxProvider:
    """What a sandbox backend needs where the episodes run: the submitter's variables that carry its credentials
    (forwarded to the job by name, values never written anywhere), the Harbor environment type that drives it
    (None: rlbuild's own, which builds no image), and the pyproject extra the nodes' runtime must hold for it. The
    trainer's package for it is found by name in trainer/sandbox/registry.py."""

    credentials: tuple[str, ...]
    harbor_type: str | None
    extra: str | None

    @property
    def builds_images(self) -> bool:
        """Whether it builds a Harbor task's image (Harbor's environments do; rlbuild's own lays out the files)."""
        return self.harbor_type is not None


HARBOR_EXTRA = "harbor"
# The one registry of sandbox backends, each declared once: `environment.sandbox.backend` names one of these, and
# every other list of backends below derives from it.
SANDBOX_PROVIDERS: dict[str, SandboxProvider] = {
    "local": SandboxProvider((), None, None),
    "daytona": SandboxProvider(("DAYTONA_API_KEY",), "daytona", HARBOR_EXTRA),
    "modal": SandboxProvider(("MODAL_TOKEN_ID", "MODAL_TOKEN_SECRET"), "modal", HARBOR_EXTRA),
    "e2b": SandboxProvider(("E2B_API_KEY",), "e2b", HARBOR_EXTRA),
    "docker": SandboxProvider((), "docker", HARBOR_EXTRA),
}
SandboxBackend = Literal[tuple(SANDBOX_PROVIDERS)]  # the registry's names, as the schema checks them
BUILDING_BACKENDS = tuple(name for name, provider in SANDBOX_PROVIDERS.items() if provider.builds_images)
# Backends that build no image: they run a Harbor task only if its Dockerfile builds nothing (rows.local_image).
IMAGELESS_BACKENDS = tuple(name for name in SANDBOX_PROVIDERS if name not in BUILDING_BACKENDS)


class SandboxSection(StrictModel):
    """Where an agent's actions run: one sandbox per episode (trainer/sandbox/). The limits bound what a model's
    action can take from the host; an action that meets one ends its episode, with the observation saying which."""

    backend: SandboxBackend = Field(
        "local",
        description="local: bubblewrap on this node, one persistent shell per episode (trainer/sandbox/); "
        f"{', '.join(BUILDING_BACKENDS)}: Harbor's environment of that type, started from the GPU nodes (the "
        "`harbor` extra)",
    )
    max_concurrent: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description="episodes holding a sandbox at once, all engines together: K per engine x engines (seed 003's "
        "n_concurrent_trials); null: every episode of a step at once",
    )
    command_timeout_s: float = Field(10.0, gt=0, le=3600, description="seconds one command may run")
    episode_timeout_s: float = Field(60.0, gt=0, le=86_400, description="seconds of sandbox time per episode")
    memory_mb: int = Field(512, ge=32, le=1_048_576, description="address space of the sandbox's processes (MiB)")
    max_processes: int = Field(64, ge=4, le=100_000, description="processes alive in the sandbox at once")
    max_output_bytes: int = Field(8192, ge=64, le=100_000_000, description="bytes of one command's output kept")
    max_file_bytes: int = Field(
        10_485_760, ge=1024, le=1 << 40, description="largest file a command in the sandbox may write (bytes)"
    )


class EnvironmentSection(StrictModel):
    env_class: str = Field("exact_match", min_length=1, max_length=200, description="the reward environment")
    env_config: dict[str, Any] = Field(
        default_factory=dict,
        description="settings the environment is built with (skyrl-gym's env_config: `Env(env_config, extras)`)",
    )
    max_turns: int = Field(
        1, ge=1, le=1000, description="turns of an agent episode at most (1: one completion, scored by reward())"
    )
    turn_stop: str = Field(
        "\n", min_length=1, max_length=16, description="what ends an action: the engine stops the turn at it"
    )
    max_context_tokens: int | None = Field(
        None,
        ge=2,
        le=10_000_000,
        description="prompt + every turn's tokens at most; an episode that reaches it ends truncated. null: the "
        "model's own context (its tokenizer's model_max_length); preflight then refuses max_prompt_length + "
        "max_turns x max_generate_length past the model's positions",
    )
    max_concurrency: int = Field(
        8, ge=1, le=100_000, description="environment steps (sandbox commands) in flight at once"
    )
    sandbox: SandboxSection | None = Field(
        None, description="the sandbox each episode's actions run in; null: the environment needs none"
    )
    trajectories_per_step: int = Field(
        4,
        ge=0,
        le=100_000,
        description="training episodes a step writes to artifacts.trajectories_root (one per group)",
    )


class Recipe(StrictModel):
    """The whole trainer recipe, as the launch document carries it."""

    trainer: TrainerSection = Field(default_factory=TrainerSection, description="training")
    generator: GeneratorSection = Field(default_factory=GeneratorSection, description="rollouts")
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection, description="rewards")

    @property
    def reference_workers(self) -> int:
        """Workers of a reference role with GPUs of its own; 0 when the reference lives in the policy workers.

        The role plan gives the reference its own nodes with `colocate_all: false` and `ref_num_nodes > 0`
        (rendered as `colocate_policy_ref: false`); without a KL term there is nothing for it to do.
        """
        placement = self.trainer.placement
        if placement.colocate_all or placement.colocate_policy_ref or not self.trainer.algorithm.use_kl_loss:
            return 0
        return placement.ref_num_nodes * placement.ref_num_gpus_per_node


def recipe_problems(recipe: Recipe) -> list[Violation]:
    """What no single field can say about itself: settings that contradict each other or GRPO."""
    t, g = recipe.trainer, recipe.generator
    out: list[Violation] = []
    if g.sampling_params.temperature <= 0:
        out.append(
            Violation(
                "recipe.generator.sampling_params.temperature",
                f"must be > 0 for GRPO rollouts (got {g.sampling_params.temperature!r}); greedy rollouts give every "
                "sample of a group the same answer and zero advantage",
                "use 1.0",
            )
        )
    if t.algorithm.use_tis and t.algorithm.tis_imp_ratio_cap <= 0:
        out.append(
            Violation(
                "recipe.trainer.algorithm.tis_imp_ratio_cap",
                f"use_tis=true needs a positive cap, got {t.algorithm.tis_imp_ratio_cap!r}",
                "set tis_imp_ratio_cap: 2.0",
            )
        )
    out += _loop_problems(t)
    if t.resume_mode == "from_path" and "global_step_" not in str(t.resume_path):
        out.append(
            Violation(
                "recipe.trainer.resume_path",
                f"resume_mode=from_path needs a global_step_N folder, got {t.resume_path!r}",
                "point resume_path at .../checkpoints/global_step_N",
            )
        )
    return out


def _loop_problems(t: TrainerSection) -> list[Violation]:
    """fully_async trains on samples up to max_staleness_steps policy versions old: TIS (rollout -> trainer
    logprobs) is the correction, so it must be on; a bound stated for the synchronous loop would do nothing."""
    if t.entrypoint == "fully_async" and not t.algorithm.use_tis:
        return [
            Violation(
                "recipe.trainer.algorithm.use_tis",
                "runtime.entrypoint fully_async trains on samples generated by older weights (up to "
                f"max_staleness_steps={t.fully_async.max_staleness_steps}); without truncated importance sampling "
                "their policy-gradient terms are biased",
                "set use_tis: true and tis_imp_ratio_cap: 2.0",
            )
        ]
    if t.entrypoint == "grpo" and "fully_async" in t.model_fields_set:
        return [
            Violation(
                "recipe.trainer.fully_async",
                f"states {t.fully_async.model_dump()} but runtime.entrypoint is grpo, whose every sample is "
                "generated by the last step's weights: the bound would do nothing",
                "delete recipe.trainer.fully_async, or set runtime.entrypoint: fully_async",
            )
        ]
    return []
