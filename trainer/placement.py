"""Ray: connect to the gang's cluster (or start a local one) and place the roles the role plan describes.

Placement follows SkyRL: one placement-group bundle per policy rank ("GPU" slice). With `colocate_all` the
policy ranks, their reference models (which live inside the policy workers) and the inference engines share
those bundles, each taking half of a slice; otherwise the engines get bundles of their own, and so does the
reference when the role plan gives it nodes (`Recipe.reference_workers`). On a machine without GPUs a bundle is one
CPU, so the role-plan arithmetic is exercised exactly as on a cluster.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlbuild.manifest import materialise
from rlbuild.recipe import Recipe
from trainer.engines import make_engine
from trainer.errors import TrainerError
from trainer.policy import PolicyWorker
from trainer.reference import ReferenceWorker
from trainer.roles import Roles, rendezvous

REPO_ROOT = Path(__file__).resolve().parent.parent
PLACEMENT_TIMEOUT_S = 180
COLOCATED_SHARE = 0.5


class PlacementError(TrainerError):
    """The cluster cannot hold the role plan."""


def connect(address: str | None, num_bundles: int) -> bool:
    """Join `address` (or RAY_ADDRESS); else start a local Ray. Returns True when this process started it."""
    env = {
        "env_vars": {
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1",
        }
    }
    if ray.is_initialized():
        return False
    if address:
        ray.init(address=address, runtime_env=env, log_to_driver=True)
        return False
    # "local" starts a private cluster: with no address, Ray would join whatever cluster last started here.
    ray.init(
        address="local",
        num_cpus=max(os.cpu_count() or 1, num_bundles),
        include_dashboard=False,
        runtime_env=env,
        log_to_driver=True,
        configure_logging=False,
    )
    return True


class EngineActor:
    """An inference engine in its own Ray actor (the engine objects are plain classes; see trainer/engines.py)."""

    def __init__(self, backend: str, model_uri: str, cache_dir: str, recipe: Recipe) -> None:
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


def _shape(recipe: Recipe) -> tuple[int, int, int, bool]:
    """(policy ranks, engines, bundles per engine, colocated) from the role-plan keys of the recipe."""
    g = recipe.generator
    engine_slots = (
        g.inference_engine_tensor_parallel_size
        * g.inference_engine_pipeline_parallel_size
        * g.inference_engine_data_parallel_size
    )
    placement = recipe.trainer.placement
    return placement.policy_world_size, g.num_inference_engines, engine_slots, placement.colocate_all


def bundles_needed(recipe: Recipe) -> int:
    world, num_engines, engine_slots, colocated = _shape(recipe)
    return world if colocated else world + recipe.reference_workers + num_engines * engine_slots


def _reserve(recipe: Recipe) -> tuple[PlacementGroup, dict[str, float]]:
    """One bundle per policy rank (plus, for separate roles, the reference's and the engines'), all ready."""
    world, num_engines, engine_slots, colocated = _shape(recipe)
    if colocated and num_engines * engine_slots != world:
        raise PlacementError(
            f"colocate_all needs policy GPUs ({world}) == engines x tp x pp x dp ({num_engines * engine_slots}); "
            "fix the role plan"
        )
    gpu = ray.cluster_resources().get("GPU", 0) > 0
    bundle = {"GPU": 1, "CPU": 1} if gpu else {"CPU": 1}
    bundles = bundles_needed(recipe)
    strategy = "STRICT_PACK" if recipe.trainer.placement.policy_num_nodes == 1 and colocated else "PACK"
    group = placement_group([dict(bundle) for _ in range(bundles)], strategy=strategy)
    ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_TIMEOUT_S)
    if not ready:
        remove_placement_group(group)
        raise PlacementError(
            f"placement group of {bundles} x {bundle} was not ready within {PLACEMENT_TIMEOUT_S}s; the cluster has "
            f"{ray.cluster_resources()}. Fix the role plan or the allocation."
        )
    return group, bundle


def start_roles(recipe: Recipe, address: str | None, model_uri: str, cache_dir: str, backend: str) -> Roles:
    """Connect to Ray (or start a private one), then start the roles and open the weight-sync group."""
    started = connect(address, bundles_needed(recipe))
    roles = place_roles(recipe, model_uri, cache_dir, backend)
    roles.started_ray = started
    roles.open_weight_sync(recipe.generator.weight_sync_backend)
    return roles


def place_roles(recipe: Recipe, model_uri: str, cache_dir: str, backend: str) -> Roles:
    """Start the policy ranks (joined into one process group), the reference workers and the engines."""
    world, num_engines, engine_slots, colocated = _shape(recipe)
    group, bundle = _reserve(recipe)
    share = COLOCATED_SHARE if colocated else 1.0
    threads = recipe.trainer.num_threads

    def options(index: int, fraction: float) -> dict[str, Any]:
        resources = {"num_gpus": fraction, "num_cpus": 0} if "GPU" in bundle else {"num_cpus": fraction}
        strategy = PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)
        return {**resources, "scheduling_strategy": strategy}

    policy = [
        ray.remote(PolicyWorker)
        .options(**options(rank, share))
        .remote(rank, world, recipe, model_uri, cache_dir, threads)
        for rank in range(world)
    ]
    reference = [
        ray.remote(ReferenceWorker).options(**options(world + i, 1.0)).remote(recipe, model_uri, cache_dir, threads)
        for i in range(recipe.reference_workers)
    ]
    first_engine_bundle = 0 if colocated else world + len(reference)
    engines = [
        ray.remote(EngineActor)
        .options(**options(first_engine_bundle + i * engine_slots, share))
        .remote(backend, model_uri, cache_dir, recipe)
        for i in range(num_engines)
    ]
    master_addr, port = rendezvous(policy[0], ray.get([w.node.remote() for w in policy]))
    ray.get([w.setup.remote(master_addr, port) for w in policy])
    return Roles(policy, engines, reference, group)
