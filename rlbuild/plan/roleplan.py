"""Role-plan arithmetic: the GPU geometry of policy, reference and rollout engines, and batch divisibility.

```
engine slice = TP * PP          engine ranks = TP * PP * DP
policy GPUs  = policy nodes * policy GPUs per node
rollout GPUs = engines * engine ranks
colocated:  each TP*PP slice divides a node; policy GPUs == rollout GPUs; total = policy GPUs
separate:   one engine's ranks fit in one node; total = policy + reference + rollout GPUs
packing:    once the counts add up, every engine (TP*PP*DP GPUs, one node) packs onto its nodes
            (rlbuild/contracts/layout.py)
EP divides TP*DP;  total == nodes * GPUs per node;  train % mini == 0;
mini * samples splits over the policy ranks into micro-batches (micro counts samples, as in SkyRL)
fully_async: train batch == mini batch, roles separate
```
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from rlbuild.contracts.layout import PackingError, Shape, pack, shape_of_recipe
from rlbuild.contracts.recipe import Recipe
from rlbuild.core.errors import Violation
from rlbuild.plan.spec import RolePlan, Runtime, Topology

RP = "role_plan"


@dataclass(frozen=True)
class Geometry:
    """The derived numbers a reviewer checks before a launch."""

    engine_slice: int
    engine_ranks: int
    policy_gpus: int
    reference_gpus: int
    rollout_gpus: int
    planned_gpus: int
    allocated_gpus: int
    policy_world_size: int
    samples_per_step: int
    optimizer_steps_per_global_step: int
    micro_batches_per_optimizer_step: int

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def geometry(topology: Topology, plan: RolePlan) -> Geometry:
    tp = plan.inference_engine_tensor_parallel_size
    pp = plan.inference_engine_pipeline_parallel_size
    dp = plan.inference_engine_data_parallel_size
    engine_slice = tp * pp
    engine_ranks = engine_slice * dp
    policy_gpus = plan.policy_num_nodes * plan.policy_num_gpus_per_node
    reference_gpus = 0 if plan.colocate_all else plan.ref_num_nodes * plan.policy_num_gpus_per_node
    rollout_gpus = plan.num_inference_engines * engine_ranks
    planned = policy_gpus if plan.colocate_all else policy_gpus + reference_gpus + rollout_gpus
    samples_per_mini = plan.policy_mini_batch_size * plan.n_samples_per_prompt
    per_rank = samples_per_mini // policy_gpus if policy_gpus else 0
    return Geometry(
        engine_slice=engine_slice,
        engine_ranks=engine_ranks,
        policy_gpus=policy_gpus,
        reference_gpus=reference_gpus,
        rollout_gpus=rollout_gpus,
        planned_gpus=planned,
        allocated_gpus=topology.num_nodes * topology.gpus_per_node,
        policy_world_size=policy_gpus,
        samples_per_step=plan.train_batch_size * plan.n_samples_per_prompt,
        optimizer_steps_per_global_step=max(plan.train_batch_size // plan.policy_mini_batch_size, 1),
        micro_batches_per_optimizer_step=max(per_rank // plan.micro_train_batch_size_per_gpu, 1),
    )


def check_role_plan(topology: Topology, plan: RolePlan, runtime: Runtime) -> list[Violation]:
    """Every violation of the role-plan contract, each with the numbers and a fix."""
    g = geometry(topology, plan)
    tp = plan.inference_engine_tensor_parallel_size
    dp = plan.inference_engine_data_parallel_size
    ep = plan.inference_engine_expert_parallel_size
    out = _count_violations(topology, plan, g)
    if not out:
        # The counts add up: what is left is whether every engine finds a node (the trainer places this layout).
        out += _packing_violations(topology, plan)
    if (tp * dp) % ep:
        out.append(
            Violation(
                f"{RP}.inference_engine_expert_parallel_size",
                f"EP={ep} does not divide TP*DP={tp}*{dp}={tp * dp} (pipeline stages form separate expert groups)",
                f"choose EP among the divisors of {tp * dp}: {_divisors(tp * dp)}",
            )
        )
    out += _check_batches(plan, g, runtime)
    return out


def _engine_sizes(plan: RolePlan) -> tuple[int, int, int]:
    """One engine's (TP, PP, DP)."""
    return (
        plan.inference_engine_tensor_parallel_size,
        plan.inference_engine_pipeline_parallel_size,
        plan.inference_engine_data_parallel_size,
    )


def _count_violations(topology: Topology, plan: RolePlan, g: Geometry) -> list[Violation]:
    """The GPU arithmetic: nodes, slices and totals."""
    tp, pp, dp = _engine_sizes(plan)
    gpn = topology.gpus_per_node
    out: list[Violation] = []

    if plan.policy_num_nodes > topology.num_nodes:
        out.append(
            Violation(
                f"{RP}.policy_num_nodes",
                f"policy_num_nodes={plan.policy_num_nodes} exceeds topology.num_nodes={topology.num_nodes}",
                f"lower it to at most {topology.num_nodes} or raise topology.num_nodes",
            )
        )
    if plan.policy_num_gpus_per_node != gpn:
        relation = "exceeds" if plan.policy_num_gpus_per_node > gpn else "does not fill"
        out.append(
            Violation(
                f"{RP}.policy_num_gpus_per_node",
                f"policy_num_gpus_per_node={plan.policy_num_gpus_per_node} {relation} a "
                f"{gpn}-GPU node (the policy takes whole nodes)",
                f"set policy_num_gpus_per_node={gpn}",
            )
        )

    if plan.colocate_all:
        out += _colocated_violations(topology, plan, g)
    elif g.engine_ranks > gpn:
        out.append(
            Violation(
                f"{RP}.inference_engine_data_parallel_size",
                f"one engine's ranks TP*PP*DP={tp}*{pp}*{dp}={g.engine_ranks} do not fit in a {gpn}-GPU node",
                f"keep TP*PP*DP <= {gpn} and add engines instead (num_inference_engines)",
            )
        )

    if g.planned_gpus != g.allocated_gpus and not (plan.colocate_all and g.policy_gpus != g.rollout_gpus):
        out.append(_total_violation(topology, plan, g))
    return out


def _colocated_violations(topology: Topology, plan: RolePlan, g: Geometry) -> list[Violation]:
    """Colocated roles: the engine slice tiles a node, no reference nodes, policy GPUs == rollout GPUs."""
    tp, pp, dp = _engine_sizes(plan)
    gpn = topology.gpus_per_node
    out: list[Violation] = []
    if gpn % g.engine_slice:
        out.append(
            Violation(
                f"{RP}.inference_engine_tensor_parallel_size",
                f"colocated engine slice TP*PP={tp}*{pp}={g.engine_slice} does not tile a {gpn}-GPU node",
                f"choose TP*PP among the divisors of {gpn}: {_divisors(gpn)}",
            )
        )
    if plan.ref_num_nodes:
        out.append(
            Violation(
                f"{RP}.ref_num_nodes",
                f"ref_num_nodes={plan.ref_num_nodes} with colocate_all=true: colocated roles put the "
                "reference on the policy's GPUs",
                "set ref_num_nodes: 0, or colocate_all: false to give the reference its own nodes",
            )
        )
    if g.policy_gpus != g.rollout_gpus:
        out.append(
            Violation(
                f"{RP}.num_inference_engines",
                f"colocated policy GPUs ({plan.policy_num_nodes}*{plan.policy_num_gpus_per_node}="
                f"{g.policy_gpus}) != rollout GPUs (engines {plan.num_inference_engines} * TP {tp} * PP {pp} "
                f"* DP {dp} = {g.rollout_gpus})",
                _colocated_fix(topology, plan, g),
            )
        )
    return out


def role_plan_recipe_keys(plan: RolePlan) -> dict[str, Any]:
    """The recipe keys the role plan owns, with the values it renders: the one mapping from a role plan to the
    recipe, which the packing reads back (shape_of_recipe), in preflight and in the trainer alike."""
    return {
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


def shape_of_plan(topology: Topology, plan: RolePlan) -> Shape:
    """The packing's view of an experiment: its role plan rendered into the recipe, read as the trainer reads its
    launch document (shape_of_recipe). A ValidationError where the rendered values are outside the recipe's
    ranges (compose_recipe names them)."""
    tree: dict[str, Any] = {}
    for dotted, value in role_plan_recipe_keys(plan).items():
        *parents, leaf = dotted.split(".")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return shape_of_recipe(Recipe.model_validate(tree), topology.num_nodes, topology.gpus_per_node)


def _packing_violations(topology: Topology, plan: RolePlan) -> list[Violation]:
    try:
        pack(shape_of_plan(topology, plan))
    except ValidationError:
        return []  # a role-plan value outside the recipe's range: compose_recipe names it
    except PackingError as error:
        return [Violation(f"{RP}.num_inference_engines", str(error), _packing_fix(topology, plan, error.shape))]
    return []


def _packing_fix(topology: Topology, plan: RolePlan, shape: Shape) -> str:
    """Role plans one change away that pack and use every GPU: another TP (or DP) with the engines it needs."""
    gpn = topology.gpus_per_node
    suggestions: list[str] = []
    for key, label, current in (
        ("inference_engine_tensor_parallel_size", "TP", shape.tp),
        ("inference_engine_data_parallel_size", "DP", shape.dp),
    ):
        others = shape.engine_gpus // current
        widths = [d for d in range(1, gpn + 1) if gpn % d == 0 and d % others == 0 and d // others != current]
        below = [d for d in widths if d // others < current][-1:]
        above = [d for d in widths if d // others > current][:1]
        for width in below + above:
            engines = len(shape.engine_nodes) * gpn // width
            candidate = plan.model_copy(update={key: width // others, "num_inference_engines": engines})
            if engines and _fits(topology, candidate):
                suggestions.append(f"{label}={width // others} with num_inference_engines={engines}")
    idle = len(shape.engine_nodes) * gpn - shape.engines_that_fit * shape.engine_gpus
    keep = (
        f" (keeping {shape.engine_gpus}-GPU engines, {shape.engines_that_fit} fit and {idle} GPUs would sit idle)"
        if shape.engines_that_fit
        else ""
    )
    options = " or ".join(suggestions) if suggestions else f"choose TP*PP*DP among the divisors of {gpn}"
    return f"make each engine's GPUs divide the {gpn}-GPU node: {options}{keep}"


def _fits(topology: Topology, plan: RolePlan) -> bool:
    """Whether a candidate role plan (a suggested fix) adds up and packs; fixes must never suggest a failure."""
    g = geometry(topology, plan)
    gpn = topology.gpus_per_node
    tp, dp = plan.inference_engine_tensor_parallel_size, plan.inference_engine_data_parallel_size
    if (tp * dp) % plan.inference_engine_expert_parallel_size or g.planned_gpus != g.allocated_gpus:
        return False
    if plan.colocate_all and (gpn % g.engine_slice or g.policy_gpus != g.rollout_gpus):
        return False
    if not plan.colocate_all and g.engine_ranks > gpn:
        return False
    try:
        pack(shape_of_plan(topology, plan))
    except (PackingError, ValidationError):
        return False
    return True


def _total_violation(topology: Topology, plan: RolePlan, g: Geometry) -> Violation:
    tp = plan.inference_engine_tensor_parallel_size
    pp = plan.inference_engine_pipeline_parallel_size
    dp = plan.inference_engine_data_parallel_size
    if plan.colocate_all:
        parts = f"colocated policy {g.policy_gpus}"
    else:
        parts = (
            f"policy {g.policy_gpus} + reference {g.reference_gpus} + rollout "
            f"{plan.num_inference_engines}*{tp}*{pp}*{dp}={g.rollout_gpus}"
        )
    message = f"the plan describes {g.planned_gpus} of {g.allocated_gpus} allocated GPUs ({parts})"
    fixes: list[str] = []
    if not plan.colocate_all:
        spare = g.allocated_gpus - g.policy_gpus - g.reference_gpus
        per_dp = plan.num_inference_engines * tp * pp
        want = spare // per_dp if spare > 0 and spare % per_dp == 0 else dp
        if want != dp and _fits(topology, plan.model_copy(update={"inference_engine_data_parallel_size": want})):
            message = f"rollout DP={dp} describes {g.planned_gpus} of {g.allocated_gpus} GPUs"
            fixes.append(f"inference_engine_data_parallel_size={want} would consume them")
        per_engine = tp * pp * dp
        engines = spare // per_engine if spare > 0 and spare % per_engine == 0 else plan.num_inference_engines
        if engines != plan.num_inference_engines and _fits(
            topology, plan.model_copy(update={"num_inference_engines": engines})
        ):
            fixes.append(f"num_inference_engines={engines} would consume them")
    nodes = g.planned_gpus // topology.gpus_per_node
    if g.planned_gpus % topology.gpus_per_node == 0 and _fits(topology.model_copy(update={"num_nodes": nodes}), plan):
        fixes.append(f"topology.num_nodes={nodes} would match the plan")
    fix = " or ".join(fixes) if fixes else "make the role plan consume exactly num_nodes * gpus_per_node GPUs"
    field = (
        f"{RP}.{fixes[0].split('=', 1)[0]}" if fixes and not fixes[0].startswith("topology") else ("topology.num_nodes")
    )
    return Violation(field, message, fix)


def _colocated_fix(topology: Topology, plan: RolePlan, g: Geometry) -> str:
    engines = g.policy_gpus // g.engine_ranks
    if g.policy_gpus % g.engine_ranks == 0 and _fits(
        topology, plan.model_copy(update={"num_inference_engines": engines})
    ):
        return f"num_inference_engines={engines} would cover the {g.policy_gpus} policy GPUs"
    return f"make engines * TP * PP * DP equal the {g.policy_gpus} policy GPUs, each engine within one node"


def _check_batches(plan: RolePlan, g: Geometry, runtime: Runtime) -> list[Violation]:
    out: list[Violation] = []
    train, mini, micro = plan.train_batch_size, plan.policy_mini_batch_size, plan.micro_train_batch_size_per_gpu
    n = plan.n_samples_per_prompt
    if train % mini:
        out.append(
            Violation(
                f"{RP}.policy_mini_batch_size",
                f"train_batch_size={train} is not a multiple of policy_mini_batch_size={mini}",
                f"choose a mini batch among the divisors of {train}: {_divisors(train)}",
            )
        )
    world = g.policy_world_size
    if world and (mini * n) % world:
        out.append(
            Violation(
                f"{RP}.policy_mini_batch_size",
                f"a mini batch of {mini} prompts * {n} samples = {mini * n} samples does not split over "
                f"{world} policy ranks",
                f"make policy_mini_batch_size * n_samples_per_prompt a multiple of {world}",
            )
        )
    elif world and ((mini * n) // world) % micro:
        per_rank = (mini * n) // world
        out.append(
            Violation(
                f"{RP}.micro_train_batch_size_per_gpu",
                f"each policy rank gets {per_rank} samples per mini batch, not a multiple of "
                f"micro_train_batch_size_per_gpu={micro}",
                f"choose a micro batch among the divisors of {per_rank}: {_divisors(per_rank)}",
            )
        )
    if n < 2:
        out.append(
            Violation(
                f"{RP}.n_samples_per_prompt",
                f"n_samples_per_prompt={n}: GRPO advantages are relative within a prompt's group, so one sample "
                "always gets advantage 0 and nothing is learned",
                "use at least 2 (typically 4-16)",
            )
        )
    if runtime.entrypoint == "fully_async":
        if train != mini:
            out.append(
                Violation(
                    f"{RP}.policy_mini_batch_size",
                    f"fully_async needs train_batch_size == policy_mini_batch_size (got {train} and {mini})",
                    f"set policy_mini_batch_size={train}",
                )
            )
        if plan.colocate_all:
            out.append(
                Violation(
                    f"{RP}.colocate_all",
                    "fully_async generates while training, so engines need their own GPUs",
                    "set colocate_all: false and give engines their own GPUs",
                )
            )
    return out


def _divisors(n: int, shown: int = 12) -> str:
    """The divisors of n, ascending (at most `shown` of them): O(sqrt n), whatever a typo makes n."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    found = sorted({*small, *(n // d for d in small)})
    return ", ".join(map(str, found[:shown])) + (", ..." if len(found) > shown else "")
