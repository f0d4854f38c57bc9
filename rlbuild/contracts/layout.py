"""Which node every role's GPUs are on: the one packing that preflight checks and the trainer places.

Nodes are numbered 0..N-1 (on a gang, node i is the task of rank i). The policy takes whole nodes 0..P-1. A
reference with nodes of its own takes the next R whole nodes. Each rollout engine takes TP*PP*DP GPUs on ONE
node, packed first-fit, in engine order, onto the engine nodes: the policy's nodes when the roles are
colocated (the engines share the policy's GPUs, each engine tiling its share of a node), otherwise the nodes
the policy and the reference leave free.

An engine's DP replicas stay on the engine's node, next to each other (replica d takes GPUs
first_gpu + d*TP*PP ..): the engine runs as one actor whose vLLM instance starts its replicas as local
processes, and its expert-parallel groups (which span TP*DP ranks) do their all-to-all over the node's
NVLink. So each TP*PP slice is on one node because the whole engine is.

Every engine has the same width, so first-fit is optimal: `gpus_per_node // width` engines per node, and a
layout packs exactly when the engine count does not exceed that times the engine nodes. Ray's own scheduler,
placing one STRICT_PACK group per engine after the policy's whole-node groups, reaches the same count.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlbuild.contracts.recipe import Recipe
from rlbuild.core.errors import RlbuildError


@dataclass(frozen=True)
class Shape:
    """What the packing needs to know: the nodes, the roles' node counts, the engines and their parallelism."""

    num_nodes: int
    gpus_per_node: int
    policy_nodes: int
    reference_nodes: int
    colocated: bool
    engines: int
    tp: int
    pp: int
    dp: int

    @property
    def engine_gpus(self) -> int:
        """One engine's GPUs: its DP replicas of one TP*PP slice each."""
        return self.tp * self.pp * self.dp

    @property
    def engine_nodes(self) -> tuple[int, ...]:
        if self.colocated:
            return tuple(range(min(self.policy_nodes, self.num_nodes)))
        return tuple(range(self.policy_nodes + self.reference_nodes, self.num_nodes))

    @property
    def engines_per_node(self) -> int:
        return self.gpus_per_node // self.engine_gpus

    @property
    def engines_that_fit(self) -> int:
        return len(self.engine_nodes) * self.engines_per_node


@dataclass(frozen=True)
class EngineSlot:
    """Where one engine runs: GPUs first_gpu .. first_gpu + gpus - 1 of one node."""

    node: int
    first_gpu: int
    gpus: int

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(range(self.first_gpu, self.first_gpu + self.gpus))


@dataclass(frozen=True)
class Layout:
    shape: Shape
    policy_nodes: tuple[int, ...]
    reference_nodes: tuple[int, ...]
    engines: tuple[EngineSlot, ...]

    def policy_rank(self, rank: int) -> tuple[int, int]:
        """(node, GPU) of a policy rank: ranks fill the policy's nodes in order."""
        per_node = self.shape.gpus_per_node
        return self.policy_nodes[rank // per_node], rank % per_node

    def reference_worker(self, index: int) -> tuple[int, int]:
        """(node, GPU) of a reference worker: workers fill the reference's nodes in order."""
        per_node = self.shape.gpus_per_node
        return self.reference_nodes[index // per_node], index % per_node

    def summary(self) -> str:
        """The layout in a line of a plan: which nodes each role has, and how the engines pack."""
        reference = f", reference {_nodes(self.reference_nodes)}" if self.reference_nodes else ""
        used = sorted({slot.node for slot in self.engines})
        return (
            f"policy {_nodes(self.policy_nodes)}{reference}; engines on {_nodes(tuple(used))}, up to "
            f"{self.shape.engines_per_node} per node, {self.shape.engine_gpus} GPU(s) each on one node"
        )

    def describe(self) -> str:
        """One line a person reads in the train log: which nodes hold which role."""
        engines: dict[int, list[str]] = {}
        for i, slot in enumerate(self.engines):
            engines.setdefault(slot.node, []).append(f"{i}@{slot.first_gpu}-{slot.first_gpu + slot.gpus - 1}")
        placed = "; ".join(f"node {node}: {', '.join(parts)}" for node, parts in sorted(engines.items()))
        reference = f", reference nodes {list(self.reference_nodes)}" if self.reference_nodes else ""
        return (
            f"policy nodes {list(self.policy_nodes)}{reference}; engines (index@GPUs, "
            f"{self.shape.engine_gpus} GPU(s) each) {placed}"
        )


class PackingError(RlbuildError):
    """The engines do not pack onto the nodes the role plan leaves them."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        nodes = shape.engine_nodes
        size = f"{shape.gpus_per_node}-GPU node(s)"
        where = f"the policy's {len(nodes)} {size}" if shape.colocated else f"the {len(nodes)} free {size}"
        super().__init__(
            f"{shape.engines} engines of TP*PP*DP={shape.tp}*{shape.pp}*{shape.dp}={shape.engine_gpus} GPUs do not "
            f"pack onto {where}{_node_range(nodes)}: an engine "
            f"stays on one node, so {shape.engines_per_node} fit per node, {shape.engines_that_fit} in all"
        )


def _nodes(nodes: tuple[int, ...]) -> str:
    if len(nodes) == 1:
        return f"node {nodes[0]}"
    return f"nodes {nodes[0]}-{nodes[-1]}"


def _node_range(nodes: tuple[int, ...]) -> str:
    return f" ({_nodes(nodes)})" if nodes else ""


def pack(shape: Shape) -> Layout:
    """Every role's nodes and every engine's GPUs; PackingError when the engines do not fit."""
    if shape.engines > shape.engines_that_fit:
        raise PackingError(shape)
    slots = []
    for index in range(shape.engines):
        node = shape.engine_nodes[index // shape.engines_per_node]
        slots.append(EngineSlot(node, (index % shape.engines_per_node) * shape.engine_gpus, shape.engine_gpus))
    first_reference = shape.policy_nodes
    return Layout(
        shape=shape,
        policy_nodes=tuple(range(shape.policy_nodes)),
        reference_nodes=tuple(range(first_reference, first_reference + shape.reference_nodes)),
        engines=tuple(slots),
    )


def shape_of_recipe(recipe: Recipe, num_nodes: int, gpus_per_node: int) -> Shape:
    """The shape a launch document describes: its allocation and the role-plan keys rendered into its recipe."""
    placement, g = recipe.trainer.placement, recipe.generator
    separate_reference = not placement.colocate_all and not placement.colocate_policy_ref
    return Shape(
        num_nodes=num_nodes,
        gpus_per_node=gpus_per_node,
        policy_nodes=placement.policy_num_nodes,
        reference_nodes=placement.ref_num_nodes if separate_reference else 0,
        colocated=placement.colocate_all,
        engines=g.num_inference_engines,
        tp=g.inference_engine_tensor_parallel_size,
        pp=g.inference_engine_pipeline_parallel_size,
        dp=g.inference_engine_data_parallel_size,
    )
