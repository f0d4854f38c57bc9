"""The plan a reviewer reads before a launch (seed 001's list), as text or JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rlbuild.contracts.artifacts import ARTIFACTS, is_mutable, terminal_stage
from rlbuild.contracts.layout import pack
from rlbuild.contracts.metricstream import Rate
from rlbuild.core.redact import redact
from rlbuild.core.wire import numeric_env
from rlbuild.plan import scheduling
from rlbuild.plan.modelcheck import source_model_config
from rlbuild.plan.preflight import rollout_backend
from rlbuild.plan.resolve import Plan
from rlbuild.plan.roleplan import shape_of_plan
from rlbuild.schedulers.base import PlanFacts

UNKNOWN_FIX = (
    "run the series' smoke arm (smoke: true) or an earlier version of this geometry, or declare execution.step_time_s"
)


@dataclass(frozen=True)
class Cost:
    """What a training will cost before its GPUs are allocated: GPUs held, expected wall time, GPU-hours. The rate
    comes from an earlier run of the same geometry (its own, or the series' smoke), else a declared step time."""

    gpus: int
    steps: int
    rate: Rate | None
    source: str  # where the rate comes from ("" when unknown)

    @property
    def wall_s(self) -> float | None:
        return None if self.rate is None else self.rate.startup_s + self.steps * self.rate.per_step_s

    @property
    def gpu_hours(self) -> float | None:
        wall = self.wall_s
        return None if wall is None else self.gpus * wall / 3600

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "steps": self.steps,
            "startup_s": None if self.rate is None else round(self.rate.startup_s, 3),
            "step_time_s": None if self.rate is None else round(self.rate.per_step_s, 4),
            "wall_s": None if self.wall_s is None else round(self.wall_s, 1),
            "gpu_hours": None if self.gpu_hours is None else round(self.gpu_hours, 6),
            "source": self.source or None,
        }

    def line(self) -> str:
        if self.rate is None or self.wall_s is None or self.gpu_hours is None:
            return f"{self.gpus} GPU(s) x unknown time: no step time measured or declared ({UNKNOWN_FIX})"
        return (
            f"{self.gpus} GPU(s) x {clock(self.wall_s)} = {self.gpu_hours:.4g} GPU-h ({self.rate.startup_s:.0f} s "
            f"start-up + {self.steps} steps x {self.rate.per_step_s:.3g} s, {self.source})"
        )


def clock(seconds: float) -> str:
    whole = round(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def artifact_uris(plan: Plan) -> dict[str, str]:
    return {a.kind: plan.uri(a.path(plan.key_of(a.kind))) for a in ARTIFACTS if a.kind in plan.records}


def plan_dict(
    plan: Plan,
    terminal: str | None = None,
    measured_step_time: float | None = None,
    cost: Cost | None = None,
    executor: str | None = None,
) -> dict[str, Any]:
    """The plan as data; `executor` (a Snakemake executor's name; None when not known) drops another scheduler's
    part, and `terminal` defaults to what the default target builds."""
    e, g, launch = plan.experiment, plan.geometry, plan.launch
    rp = e.role_plan
    return redact(
        {
            "experiment": e.name,
            "version": plan.version,
            "mutable": is_mutable(plan.version),
            "runtime": launch.runtime.model_dump(),
            "loop": plan.recipe.trainer.loop(),
            "rollout": {"backend": rollout_backend(e, plan.recipe), "vllm": plan.nodes.vllm},
            "nodes": {**asdict(plan.nodes), "description": plan.nodes.describe()},
            "model_config": model_config_dict(plan),
            "jobs": {kind: getattr(e.execution, kind).model_dump() for kind in ("export", "eval")},
            "allocation": {**launch.allocation.model_dump(), "total_gpus": g.allocated_gpus},
            "executor": executor,
            "schedulers": scheduling.plan_sections(e, _facts(plan, measured_step_time), executor),
            "cost": None if cost is None else cost.as_dict(),
            "sandbox": sandbox_dict(plan),
            "env": {
                "placement": {k: v for k, v in launch.env.items() if k not in numeric_env(launch.env)},
                "numerics": numeric_env(launch.env),
            },
            "geometry": geometry_dict(plan),
            "batches": {
                "train_batch_size": rp.train_batch_size,
                "policy_mini_batch_size": rp.policy_mini_batch_size,
                "micro_train_batch_size_per_gpu": rp.micro_train_batch_size_per_gpu,
                "n_samples_per_prompt": rp.n_samples_per_prompt,
                "max_steps": plan.recipe.trainer.max_steps,
            },
            "artifacts": {k: r["identity"] for k, r in plan.records.items()},
            "outputs": artifact_uris(plan),
            "temporary_root": plan.uri(plan.temporary.root),
            "terminal_stage": terminal or terminal_stage([], plan.version),
        }
    )


def geometry_dict(plan: Plan) -> dict[str, Any]:
    """The roles' GPUs, engines and their layout, with the geometry's derived counts."""
    e, g = plan.experiment, plan.geometry
    rp = e.role_plan
    return {
        "colocate_all": rp.colocate_all,
        "policy": f"{rp.policy_num_nodes}x{rp.policy_num_gpus_per_node}",
        "reference": "shares policy GPUs" if rp.colocate_all or rp.ref_num_nodes == 0 else f"{rp.ref_num_nodes} nodes",
        "engines": rp.num_inference_engines,
        "tp": rp.inference_engine_tensor_parallel_size,
        "pp": rp.inference_engine_pipeline_parallel_size,
        "dp": rp.inference_engine_data_parallel_size,
        "ep": rp.inference_engine_expert_parallel_size,
        # A resolved plan passed preflight, so its engines pack (rlbuild/contracts/layout.py).
        "layout": pack(shape_of_plan(e.topology, rp)).summary(),
        **g.as_dict(),
    }


def _facts(plan: Plan, measured_step_time: float | None) -> PlanFacts:
    return scheduling.plan_facts(plan.experiment, plan.recipe, measured_step_time)


def sandbox_dict(plan: Plan) -> dict[str, Any] | None:
    """The sandboxes the episodes hold (None: the recipe has none): how many at once, within which cap, the limits
    of one, and an upper bound on sandbox-hours (every episode of every sample batch running to its timeout; evals
    not counted: the validation rows are not known before staging)."""
    recipe = plan.recipe
    sandbox, t, g = recipe.environment.sandbox, recipe.trainer, recipe.generator
    if sandbox is None:
        return None
    per_step = t.train_batch_size * g.n_samples_per_prompt
    dynamic = t.algorithm.dynamic_sampling
    batches = dynamic.max_sample_batches if dynamic.type == "filter" else 1
    return {
        "backend": sandbox.backend,
        "max_concurrent": sandbox.max_concurrent,
        "engines": g.num_inference_engines,
        "episodes_per_step": per_step,
        "cap": plan.experiment.execution.sandbox_caps.get(sandbox.backend),
        "max_turns": recipe.environment.max_turns,
        "episode_timeout_s": sandbox.episode_timeout_s,
        "command_timeout_s": sandbox.command_timeout_s,
        "memory_mb": sandbox.memory_mb,
        "sample_batches_per_step": batches,
        "sandbox_hours_upper_bound": t.max_steps * batches * per_step * sandbox.episode_timeout_s / 3600,
    }


def format_sandbox(sandbox: dict[str, Any] | None, max_steps: int) -> list[str]:
    if sandbox is None:
        return []
    engines, at_once = sandbox["engines"], sandbox["max_concurrent"]
    if at_once is None:
        held = f"{sandbox['episodes_per_step']} episodes at once (every episode of a step: max_concurrent null)"
    else:
        held = f"{at_once} episodes at once ({at_once // engines} per engine x {engines} engine(s))"
    cap = f"cap {sandbox['cap']} (execution.sandbox_caps)" if sandbox["cap"] is not None else "no cap declared"
    batches, per_step = sandbox["sample_batches_per_step"], sandbox["episodes_per_step"]
    episodes = f"{batches} sample batches x {per_step}" if batches > 1 else str(per_step)
    return [
        f"  sandbox        {sandbox['backend']}: {held}, {cap}; max_turns {sandbox['max_turns']}; per episode "
        f"{sandbox['episode_timeout_s']:g} s, per command {sandbox['command_timeout_s']:g} s, "
        f"{sandbox['memory_mb']} MiB",
        f"  sandbox time   at most {sandbox['sandbox_hours_upper_bound']:.4g} sandbox-h (upper bound: {max_steps} "
        f"steps x {episodes} episodes x {sandbox['episode_timeout_s']:g} s episode timeout; evals not counted)",
    ]


MODEL_FIELDS = ("num_attention_heads", "num_key_value_heads", "max_position_embeddings", "vocab_size")


def model_config_dict(plan: Plan) -> dict[str, Any]:
    """What preflight knew of the model (read from its source), and the token budget checked against it."""
    config = source_model_config(plan.experiment)
    g = plan.recipe.generator
    known = {k: config.values.get(k) for k in MODEL_FIELDS} if config.values is not None else None
    return {
        "origin": config.origin,
        "fields": known,
        "length_budget": g.max_prompt_length + g.sampling_params.max_generate_length,
    }


def format_model_config(model: dict[str, Any]) -> str:
    if model["fields"] is None:
        return f"config not known before staging ({model['origin']}); checked against the staged model"
    f = model["fields"]
    return (
        f"{model['origin']}: {f['num_attention_heads']} heads, {f['num_key_value_heads']} KV heads, "
        f"{f['max_position_embeddings']} positions (prompt + generation {model['length_budget']}), "
        f"vocab {f['vocab_size']}"
    )


def format_rollout(rollout: dict[str, str | None], nodes: dict[str, str | None]) -> str:
    if rollout["backend"] != "vllm":
        return "torch: Hugging Face generate with a KV cache"
    if nodes["origin"] == "image":
        declared = f"vLLM {rollout['vllm']} declared by the image" if rollout["vllm"] else "vLLM from the image"
        return f"{declared} (each node checks it has vLLM before Ray starts)"
    where = "the nodes run this checkout's .venv" if nodes["origin"] == "venv" else "locked for the nodes, uv.lock"
    return f"vLLM {rollout['vllm']} ({where})"


def format_env(env: dict[str, dict[str, str]]) -> list[str]:
    """`execution.env` as the jobs will see it, split by whether it enters the launch identity."""
    placement = " ".join(f"{k}={v}" for k, v in env["placement"].items())
    numerics = " ".join(f"{k}={v}" for k, v in env["numerics"].items())
    return [f"  job env        {placement or '-'} (placement); {numerics or '-'} (numerics: in the launch identity)"]


def format_allocation(alloc: dict[str, Any]) -> str:
    """What the nodes hold, in the words of what they run: CPU ranks for `gpu_variant: cpu`, else GPUs."""
    nodes = _count(alloc["num_nodes"], "node")
    if alloc["gpu_variant"] == "cpu":
        held = f"{nodes} x {_count(alloc['gpus_per_node'], 'CPU rank')}"
    else:
        held = f"{nodes} x {alloc['gpus_per_node']} {alloc['gpu_variant']} = {_count(alloc['total_gpus'], 'GPU')}"
    return held


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def format_plan(
    plan: Plan,
    terminal: str | None = None,
    measured_step_time: float | None = None,
    cost: Cost | None = None,
    executor: str | None = None,
) -> str:
    d = plan_dict(plan, terminal, measured_step_time, cost, executor)
    geo, bat, alloc = d["geometry"], d["batches"], d["allocation"]
    mode = "mutable: rebuilds when inputs change" if d["mutable"] else "immutable"
    roles = (
        f"{'colocated' if geo['colocate_all'] else 'separate'}: policy {geo['policy']} = {geo['policy_gpus']} GPUs; "
        f"{geo['engines']} engine(s) TP{geo['tp']} PP{geo['pp']} DP{geo['dp']} EP{geo['ep']} = {geo['rollout_gpus']} "
        f"GPUs; reference {geo['reference']}"
    )
    lines = [
        f"rlbuild plan: {d['experiment']} @ {d['version']} ({mode})",
        f"  runtime        {d['runtime']['entrypoint']} / {d['runtime']['strategy']}, "
        f"source digest {d['runtime']['source_digest'][:16]}",
        f"  loop           {d['loop']}",
        f"  nodes run      {d['nodes']['description']}",
        f"  rollout        {format_rollout(d['rollout'], d['nodes'])}",
        f"  model          {format_model_config(d['model_config'])}",
        f"  allocation     {format_allocation(alloc)}",
        *scheduling.plan_lines(d["schedulers"], _facts(plan, measured_step_time)),
        f"  export, eval   {d['jobs']['export']['cpu']} CPUs, {d['jobs']['export']['memory']}; "
        f"{d['jobs']['eval']['cpu']} CPUs, {d['jobs']['eval']['memory']}",
        *format_env(d["env"]),
        f"  role geometry  {roles}; planned {geo['planned_gpus']} of {geo['allocated_gpus']}",
        f"  layout         {geo['layout']}",
        f"  batches        {bat['train_batch_size']} prompts x {bat['n_samples_per_prompt']} samples = "
        f"{geo['samples_per_step']} samples/step; mini {bat['policy_mini_batch_size']} "
        f"({geo['optimizer_steps_per_global_step']} optimizer step(s)/step); micro "
        f"{bat['micro_train_batch_size_per_gpu']}/GPU ({geo['micro_batches_per_optimizer_step']} micro-batches); "
        f"{bat['max_steps']} steps",
        *([f"  training cost  {cost.line()}"] if cost is not None else []),
        *format_sandbox(d["sandbox"], bat["max_steps"]),
        "  artifacts",
    ]
    for a in ARTIFACTS:
        if a.kind in d["artifacts"]:
            lines.append(f"    {a.kind:<12} {d['artifacts'][a.kind]:<58} {d['outputs'][a.kind]}")
    lines += [
        f"  temporary      {d['temporary_root']}",
        f"  terminal stage {d['terminal_stage']}",
    ]
    return "\n".join(lines)
