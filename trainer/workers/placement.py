"""Ray: place every role where the layout says, on the cluster trainer/workers/cluster.py connected to.

The layout is rlbuild/contracts/layout.py's packing, the one preflight checked: the node of each policy rank, of each
reference worker and of each engine's GPUs. Layout node i is a Ray node: on a gang, the node of rank i (its
`rlbuild_rank_i` resource); on another cluster, the i-th node in node-ID order; on a one-node cluster (the
private local Ray, one machine) every layout node is that node.

Placement groups, each STRICT_PACK and pinned to its Ray node by the node-ID label, one bundle per GPU (one CPU
on a machine without GPUs, so the layout is exercised exactly as on a cluster):
- one per policy node, one per reference node (when the reference has workers of its own);
- colocated roles: each engine sits in its TP*PP*DP bundles of a policy node's group, with half of each (SkyRL);
- separate roles: one group of TP*PP*DP bundles per engine.

An engine's actor sits in its first bundle and captures its child tasks: a vLLM engine with TP*PP > 1 starts
its Ray workers in the engine's own bundles (VLLM_RAY_BUNDLE_INDICES), while the actor itself takes no GPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.layout import Layout
from rlbuild.contracts.manifest import materialise
from rlbuild.contracts.recipe import Recipe
from rlbuild.core.wire import RANK_RESOURCE
from trainer.errors import TrainerError
from trainer.workers import cluster, sharding
from trainer.workers.engines import make_engine
from trainer.workers.policy import PolicyWorker
from trainer.workers.reference import ReferenceWorker
from trainer.workers.roles import InProcessActor, Roles, SharedEngine, collect, rendezvous

PLACEMENT_TIMEOUT_S = 180
COLOCATED_SHARE = 0.5
NODE_LABEL = "ray.io/node-id"


class PlacementError(TrainerError):
    """The cluster cannot hold the role plan."""


class EngineActor:
    """An inference engine in its own Ray actor (the engine objects are plain classes; see
    trainer/workers/engines.py)."""

    def __init__(
        self, backend: str, model_uri: str, cache_dir: str, recipe: Recipe, bundles: list[int], gpu_share: float
    ) -> None:
        if backend == "vllm" and len(bundles) > 1:
            # vLLM's Ray executor puts one worker in each of these bundles of the group this actor runs in.
            os.environ["VLLM_RAY_BUNDLE_INDICES"] = ",".join(map(str, bundles))
            os.environ["VLLM_RAY_PER_WORKER_GPUS"] = str(gpu_share)
        model_dir = materialise(model_uri, Path(cache_dir))
        self.engine = make_engine(backend, model_dir, recipe.generator, recipe.trainer.seed, recipe.trainer.num_threads)

    def generate(self, prompts: list[list[int]], params: Any, seed: int) -> list[Any]:
        return self.engine.generate(prompts, params, seed)

    def node(self) -> str:
        return ray.util.get_node_ip_address()

    def sync_ranks(self) -> int:
        return self.engine.sync_ranks()

    def open_weight_sync(self, backend: str, master_addr: str, port: int, first_rank: int, world_size: int) -> None:
        self.engine.open_weight_sync(backend, master_addr, port, first_rank, world_size)

    def receive_weights(self, specs: list[Any]) -> None:
        self.engine.receive_weights(specs)

    def sequence_logprobs(self, token_ids: list[int], start: int) -> list[float]:
        return self.engine.sequence_logprobs(token_ids, start)


class SharedEngineWorker(PolicyWorker):
    """The single policy rank of a colocated torch layout with its engine in the same process (cluster.shares_process
    says when): the weight sync copies the gathered weights into the engine instead of broadcasting them to another
    process. The driver reaches the engine through roles.SharedEngine, by the `engine_*` names."""

    def __init__(
        self, rank: int, world_size: int, recipe: Recipe, model_uri: str, cache_dir: str, num_threads: int
    ) -> None:
        super().__init__(rank, world_size, recipe, model_uri, cache_dir, num_threads)
        self.engine = make_engine("torch", self.model_dir, recipe.generator, recipe.trainer.seed, num_threads)

    def open_weight_sync(self, backend: str, master_addr: str, port: int, world_size: int) -> None:
        """Nothing to host: the only engine is in this process."""

    def broadcast_weights(self) -> None:
        self.engine.load_weights(sharding.full_state(self.model))

    def engine_generate(self, prompts: list[list[int]], params: Any, seed: int) -> list[Any]:
        return self.engine.generate(prompts, params, seed)

    def engine_node(self) -> str:
        return self.node()

    def engine_sync_ranks(self) -> int:
        return 0  # no rank of the weight-sync group: broadcast_weights copies

    def engine_open_weight_sync(self, backend: str, master_addr: str, port: int, first_rank: int, world: int) -> None:
        """Nothing to join (engine_sync_ranks is 0)."""

    def engine_receive_weights(self, specs: list[Any]) -> None:
        """Nothing to receive: broadcast_weights, called before this on the same actor, loaded them."""

    def engine_sequence_logprobs(self, token_ids: list[int], start: int) -> list[float]:
        return self.engine.sequence_logprobs(token_ids, start)


@dataclass
class Reservation:
    """The placement groups of a layout, ready, and where in them each role's actors go."""

    layout: Layout
    bundle: dict[str, float]
    policy: list[PlacementGroup]
    reference: list[PlacementGroup]
    engines: list[PlacementGroup]

    @property
    def groups(self) -> list[PlacementGroup]:
        return [*self.policy, *self.reference, *self.engines]

    def policy_slot(self, rank: int) -> tuple[PlacementGroup, int]:
        node, gpu = self.layout.policy_rank(rank)
        return self.policy[self.layout.policy_nodes.index(node)], gpu

    def reference_slot(self, index: int) -> tuple[PlacementGroup, int]:
        node, gpu = self.layout.reference_worker(index)
        return self.reference[self.layout.reference_nodes.index(node)], gpu

    def engine_slot(self, index: int) -> tuple[PlacementGroup, list[int]]:
        """The group holding engine `index` and its bundle indices in it (its first bundle takes the actor)."""
        slot = self.layout.engines[index]
        if self.layout.shape.colocated:
            return self.policy[self.layout.policy_nodes.index(slot.node)], list(slot.gpu_indices)
        return self.engines[index], list(range(slot.gpus))

    def options(self, group: PlacementGroup, bundle: int, share: float) -> dict[str, Any]:
        """Ray actor options: `share` of one bundle's GPU (or CPU); child tasks stay in the group."""
        resources = {"num_gpus": share, "num_cpus": 0} if "GPU" in self.bundle else {"num_cpus": share}
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=group, placement_group_bundle_index=bundle, placement_group_capture_child_tasks=True
        )
        return {**resources, "scheduling_strategy": strategy}

    def remove(self) -> None:
        for group in self.groups:
            remove_placement_group(group)


def ray_nodes(layout: Layout) -> list[str]:
    """The Ray node ID of each layout node: gang ranks in order, else node IDs in order; one node holds all."""
    gpus = layout.shape.gpus_per_node
    gpu_cluster = ray.cluster_resources().get("GPU", 0) > 0
    alive = [n for n in ray.nodes() if n.get("Alive")]
    usable = [n for n in alive if not gpu_cluster or n["Resources"].get("GPU", 0) >= gpus]
    usable.sort(key=_rank_then_id)
    needed = layout.shape.num_nodes
    if len(usable) == 1:
        return [usable[0]["NodeID"]] * needed
    if len(usable) < needed:
        raise PlacementError(
            f"the layout needs {needed} node(s) of {gpus} {'GPU' if gpu_cluster else 'CPU'}(s) and the Ray cluster has "
            f"{len(usable)} ({len(alive)} alive): a node of the gang is missing or short of GPUs. Check that every "
            "task of the gang joined Ray, or fix topology.num_nodes / gpus_per_node."
        )
    return [n["NodeID"] for n in usable[:needed]]


def _rank_then_id(node: dict[str, Any]) -> tuple[int, str]:
    ranks = [int(key.rsplit("_", 1)[-1]) for key in node["Resources"] if key.startswith(RANK_RESOURCE.format(rank=""))]
    return (min(ranks) if ranks else 1 << 30, node["NodeID"])


def reserve(layout: Layout, reference_workers: int) -> Reservation:
    """Create the layout's placement groups, each pinned to its Ray node, and wait until all are ready."""
    nodes = ray_nodes(layout)
    gpu_cluster = ray.cluster_resources().get("GPU", 0) > 0
    bundle = {"GPU": 1.0, "CPU": 1.0} if gpu_cluster else {"CPU": 1.0}
    gpus = layout.shape.gpus_per_node

    def group(size: int, node: int) -> PlacementGroup:
        selector = [{NODE_LABEL: nodes[node]}] * size
        return placement_group([dict(bundle) for _ in range(size)], "STRICT_PACK", bundle_label_selector=selector)

    reference_nodes = layout.reference_nodes[: -(-reference_workers // gpus)]
    reservation = Reservation(
        layout=layout,
        bundle=bundle,
        policy=[group(gpus, node) for node in layout.policy_nodes],
        reference=[group(gpus, node) for node in reference_nodes],
        engines=[] if layout.shape.colocated else [group(slot.gpus, slot.node) for slot in layout.engines],
    )
    _wait_ready(reservation)
    return reservation


def _wait_ready(reservation: Reservation) -> None:
    refs = [g.ready() for g in reservation.groups]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PLACEMENT_TIMEOUT_S)
    if len(ready) == len(refs):
        return
    layout = reservation.layout
    names = [f"policy node {n}" for n in layout.policy_nodes]
    names += [f"reference node {n}" for n in layout.reference_nodes[: len(reservation.reference)]]
    names += [f"engine {i} on node {slot.node}" for i, slot in enumerate(layout.engines)][: len(reservation.engines)]
    pending = [name for name, ref in zip(names, refs, strict=True) if ref not in ready]
    reservation.remove()
    raise PlacementError(
        f"placement groups of {pending} were not ready within {PLACEMENT_TIMEOUT_S}s ({layout.describe()}); the "
        f"cluster has {ray.cluster_resources()}. Fix the role plan or the allocation."
    )


def start_roles(launch: LaunchDocument, cache_dir: str, backend: str) -> Roles:
    """Start the roles (in this process when the layout is one process, cluster.in_process; else on Ray, connected
    to or started unless connected), then open the weight-sync group."""
    recipe, layout, model_uri = launch.recipe, cluster.layout_of(launch), launch.inputs.model.uri
    if cluster.in_process(launch):
        roles = roles_in_process(recipe, layout, model_uri, cache_dir)
    else:
        started = cluster.connect_for(launch)
        roles = place_roles(recipe, layout, model_uri, cache_dir, backend)
        roles.started_ray = started
    roles.open_weight_sync(recipe.generator.weight_sync_backend)
    return roles


def roles_in_process(recipe: Recipe, layout: Layout, model_uri: str, cache_dir: str) -> Roles:
    """The single policy rank and its engine (SharedEngineWorker) in this process: what place_roles starts for
    this layout, without Ray."""
    rank = InProcessActor(SharedEngineWorker(0, 1, recipe, model_uri, cache_dir, recipe.trainer.num_threads))
    print(f"[trainer] layout: {layout.describe()}, in the trainer's process", flush=True)
    print(f"[trainer] policy: {setup_group([rank])}", flush=True)
    return Roles([rank], [SharedEngine(rank)], [], [])


def place_roles(recipe: Recipe, layout: Layout, model_uri: str, cache_dir: str, backend: str) -> Roles:
    """Start the policy ranks and the reference workers (each role one process group) and the engines."""
    reservation = reserve(layout, recipe.reference_workers)
    share = COLOCATED_SHARE if layout.shape.colocated else 1.0
    threads = recipe.trainer.num_threads
    world = recipe.trainer.placement.policy_world_size
    shared = cluster.shares_process(recipe, layout, backend)
    # A rank with its engine in its process holds both halves of the bundle.
    policy = [
        ray.remote(SharedEngineWorker if shared else PolicyWorker)
        .options(**reservation.options(*reservation.policy_slot(rank), 1.0 if shared else share))
        .remote(rank, world, recipe, model_uri, cache_dir, threads)
        for rank in range(world)
    ]
    reference = [
        ray.remote(ReferenceWorker)
        .options(**reservation.options(*reservation.reference_slot(i), 1.0))
        .remote(i, recipe.reference_workers, recipe, model_uri, cache_dir, threads)
        for i in range(recipe.reference_workers)
    ]
    engines: list[Any] = [SharedEngine(policy[0])] if shared else []
    for index in range(0 if shared else layout.shape.engines):
        group, bundles = reservation.engine_slot(index)
        # A vLLM engine over several GPUs leaves them to its workers; a one-GPU or torch engine holds its own.
        actor_share = share if backend == "torch" or len(bundles) == 1 else 0.0
        engines.append(
            ray.remote(EngineActor)
            .options(**reservation.options(group, bundles[0], actor_share))
            .remote(backend, model_uri, cache_dir, recipe, bundles, share)
        )
    print(f"[trainer] layout: {layout.describe()}", flush=True)
    print(f"[trainer] policy: {setup_group(policy)}", flush=True)
    if reference:
        print(f"[trainer] reference: {setup_group(reference)}", flush=True)
    return Roles(policy, engines, reference, reservation.groups)


def setup_group(ranks: list[Any]) -> str:
    """Join the ranks into one process group, load and shard their model; rank 0's account of the sharding."""
    master_addr, port = rendezvous(ranks[0], collect([r.node.remote() for r in ranks]))
    return collect([r.setup.remote(master_addr, port) for r in ranks])[0]
