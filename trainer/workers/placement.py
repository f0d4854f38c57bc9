"""Ray: connect to the gang's cluster (or start a local one) and place every role where the layout says.

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

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlbuild.contracts.launch import LaunchDocument
from rlbuild.contracts.layout import Layout, pack, shape_of_recipe
from rlbuild.contracts.manifest import materialise
from rlbuild.contracts.recipe import Recipe
from rlbuild.core import storage
from rlbuild.core.wire import RANK_RESOURCE, RAY_TEMP_DIR_ENV
from trainer.errors import TrainerError
from trainer.workers import startup
from trainer.workers.engines import make_engine
from trainer.workers.policy import PolicyWorker
from trainer.workers.reference import ReferenceWorker
from trainer.workers.roles import Roles, rendezvous

REPO_ROOT = Path(__file__).resolve().parent.parent
PLACEMENT_TIMEOUT_S = 180
COLOCATED_SHARE = 0.5
NODE_LABEL = "ray.io/node-id"


class PlacementError(TrainerError):
    """The cluster cannot hold the role plan."""


def plain_worker_logs(environ: MutableMapping[str, str], tty: bool) -> None:
    """Ray colours the lines it forwards from the workers; in a log file (not a terminal) those are escape codes,
    so off there (RAY_COLOR_PREFIX=0, read by Ray per line) unless the environment already says otherwise."""
    if not tty:
        environ.setdefault("RAY_COLOR_PREFIX", "0")


def connect(address: str | None, num_bundles: int) -> bool:
    """Join `address` (or RAY_ADDRESS); else start a local Ray. Returns True when this process started it."""
    plain_worker_logs(os.environ, sys.stdout.isatty() and sys.stderr.isatty())
    env = {
        "env_vars": {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
            # The lease this job builds under reaches the workers on every node (a gang's other ranks started
            # Ray before the job named it): their checkpoint shards are writes under it (storage.fence).
            **{name: os.environ[name] for name in (storage.LEASE_ENV, storage.LEASE_RUN_ENV) if name in os.environ},
        }
    }
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        startup.reached("ray")
        return False
    # "local" starts a private cluster: with no address, Ray would join whatever cluster last started here.
    ray.init(
        address="local",
        _temp_dir=session_folder(),
        num_cpus=max(os.cpu_count() or 1, num_bundles),
        include_dashboard=False,
        runtime_env=env,
        log_to_driver=True,
        configure_logging=False,
    )
    startup.reached("ray")
    return True


def session_folder() -> str:
    """Where the local Ray keeps its session: the folder `rlbuild train` made for this run (it removes it, and
    ends what Ray left, however the trainer ends), else a fresh one of this process's, removed at its exit (Ray's
    own shutdown at exit runs first). Under /tmp, not TMPDIR: Ray's unix sockets live in it, a socket path may
    not exceed 107 bytes, and a scheduler's TMPDIR (a task's own folder) can be long."""
    given = os.environ.get(RAY_TEMP_DIR_ENV)
    if given:
        return given
    folder = tempfile.mkdtemp(prefix="rlray-", dir="/tmp")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # before ray.init: runs after Ray's own handler
    return folder


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


def layout_of(launch: LaunchDocument) -> Layout:
    """The launch document's layout: the same packing preflight ran on the experiment."""
    allocation = launch.allocation
    return pack(shape_of_recipe(launch.recipe, allocation.num_nodes, allocation.gpus_per_node))


def bundles_needed(layout: Layout, reference_workers: int) -> int:
    shape = layout.shape
    engines = 0 if shape.colocated else shape.engines * shape.engine_gpus
    return len(layout.policy_nodes) * shape.gpus_per_node + reference_workers + engines


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


def start_roles(launch: LaunchDocument, address: str | None, cache_dir: str, backend: str) -> Roles:
    """Connect to Ray (or start a private one), then start the roles and open the weight-sync group."""
    layout = layout_of(launch)
    started = connect(address, bundles_needed(layout, launch.recipe.reference_workers))
    roles = place_roles(launch.recipe, layout, launch.inputs.model.uri, cache_dir, backend)
    roles.started_ray = started
    roles.open_weight_sync(launch.recipe.generator.weight_sync_backend)
    return roles


def place_roles(recipe: Recipe, layout: Layout, model_uri: str, cache_dir: str, backend: str) -> Roles:
    """Start the policy ranks and the reference workers (each role one process group) and the engines."""
    reservation = reserve(layout, recipe.reference_workers)
    share = COLOCATED_SHARE if layout.shape.colocated else 1.0
    threads = recipe.trainer.num_threads
    world = recipe.trainer.placement.policy_world_size
    policy = [
        ray.remote(PolicyWorker)
        .options(**reservation.options(*reservation.policy_slot(rank), share))
        .remote(rank, world, recipe, model_uri, cache_dir, threads)
        for rank in range(world)
    ]
    reference = [
        ray.remote(ReferenceWorker)
        .options(**reservation.options(*reservation.reference_slot(i), 1.0))
        .remote(i, recipe.reference_workers, recipe, model_uri, cache_dir, threads)
        for i in range(recipe.reference_workers)
    ]
    engines = []
    for index in range(layout.shape.engines):
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
    master_addr, port = rendezvous(ranks[0], ray.get([r.node.remote() for r in ranks]))
    return ray.get([r.setup.remote(master_addr, port) for r in ranks])[0]
