"""Engines placed per node, on a real 2-node Ray whose nodes declare 8 GPUs each (no GPU is touched).

The trainer's placement (trainer/workers/placement.py) reserves the layout that rlbuild's packing
(rlbuild/contracts/layout.py)
computes, the same one preflight checks; probe tasks in every bundle report the node they run on. Over many
generated role plans, the packing's verdict is Ray's own: a plan preflight accepts is placed, and one whose
engines it refuses for packing is one Ray's scheduler cannot place either.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections.abc import Iterator

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

from rlbuild.contracts.layout import Layout, PackingError, pack, shape_of_recipe
from rlbuild.contracts.recipe import Recipe
from rlbuild.plan.roleplan import check_role_plan, shape_of_plan
from rlbuild.plan.spec import RolePlan, Runtime, Topology
from trainer.errors import TrainerError
from trainer.workers.cluster import FORCE_RAY_ENV, forced_onto_ray, plain_worker_logs, shares_process
from trainer.workers.placement import Reservation, reserve

pytestmark = pytest.mark.timeout(300)
GPUS = 8
TOPOLOGY = Topology(num_nodes=2, gpus_per_node=GPUS, gpu_variant="H100")
GRPO = Runtime(entrypoint="grpo", strategy="fsdp2")
SURPLUS_WAIT_S = 0.5


@pytest.fixture(scope="module")
def rank_nodes() -> Iterator[dict[int, str]]:
    """Two Ray nodes of 8 GPUs, with the gang's rank resources: {rank: Ray node ID}."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # every socket on loopback
    os.environ["RAY_SCHEDULER_EVENTS"] = "0"  # the groups left pending on purpose are not news
    if ray.is_initialized():
        ray.shutdown()
    node = {"num_cpus": 2 * GPUS, "num_gpus": GPUS}
    cluster = Cluster(
        initialize_head=True, head_node_args={**node, "resources": {"rlbuild_rank_0": 1}, "include_dashboard": False}
    )
    try:
        cluster.add_node(**node, resources={"rlbuild_rank_1": 1})
        cluster.wait_for_nodes()
        cluster.connect()
        yield {
            rank: n["NodeID"]
            for n in ray.nodes()
            for rank in (0, 1)
            if n.get("Alive") and f"rlbuild_rank_{rank}" in n["Resources"]
        }
        ray.shutdown()
    finally:
        cluster.shutdown()
        os.environ.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
        os.environ.pop("RAY_SCHEDULER_EVENTS", None)


def role_plan(colocated: bool, engines: int, tp: int, pp: int = 1, dp: int = 1) -> RolePlan:
    """Colocated: the policy on both nodes. Separate: the policy on node 0, the engines on node 1."""
    return RolePlan(
        colocate_all=colocated,
        policy_num_nodes=2 if colocated else 1,
        policy_num_gpus_per_node=GPUS,
        ref_num_nodes=0,
        num_inference_engines=engines,
        inference_engine_tensor_parallel_size=tp,
        inference_engine_pipeline_parallel_size=pp,
        inference_engine_data_parallel_size=dp,
        inference_engine_expert_parallel_size=1,
        train_batch_size=16,
        policy_mini_batch_size=16,
        micro_train_batch_size_per_gpu=1,
        n_samples_per_prompt=8,
    )


@ray.remote
def where() -> str:
    return ray.get_runtime_context().get_node_id()


def _bundle_nodes(group: PlacementGroup) -> dict[int, str]:
    return placement_group_table(group)["bundles_to_node_id"]


def _probe(reservation: Reservation, group: PlacementGroup, bundle: int) -> str:
    """The node a task scheduled into this bundle runs on (one at a time: Ray reuses one worker)."""
    return ray.get(where.options(**reservation.options(group, bundle, 0.5)).remote())


def assert_placed_as_the_layout_says(layout: Layout, rank_nodes: dict[int, str]) -> None:
    """Every engine's bundles, and every policy rank's, are on the node the layout names; a task in an engine's
    first bundle (where its actor goes) and in each policy node's group runs there."""
    reservation = reserve(layout, reference_workers=0)
    try:
        for index, slot in enumerate(layout.engines):
            group, bundles = reservation.engine_slot(index)
            assert [_bundle_nodes(group)[b] for b in bundles] == [rank_nodes[slot.node]] * slot.gpus, index
            assert _probe(reservation, group, bundles[0]) == rank_nodes[slot.node], index
        for rank in range(len(layout.policy_nodes) * GPUS):
            group, bundle = reservation.policy_slot(rank)
            assert _bundle_nodes(group)[bundle] == rank_nodes[layout.policy_rank(rank)[0]], rank
        for node, group in zip(layout.policy_nodes, reservation.policy, strict=True):
            assert _probe(reservation, group, 0) == rank_nodes[node]
    finally:
        reservation.remove()


@pytest.mark.parametrize(
    ("colocated", "engines", "tp", "engine_nodes"),
    [
        (False, 8, 1, [1] * 8),
        (False, 4, 2, [1] * 4),
        (False, 2, 4, [1, 1]),
        (True, 16, 1, [0] * 8 + [1] * 8),
        (True, 8, 2, [0] * 4 + [1] * 4),
        (True, 4, 4, [0, 0, 1, 1]),
    ],
    ids=["separate-tp1", "separate-tp2", "separate-tp4", "colocated-tp1", "colocated-tp2", "colocated-tp4"],
)
def test_every_engine_lands_on_its_node(
    rank_nodes: dict[int, str], colocated: bool, engines: int, tp: int, engine_nodes: list[int]
) -> None:
    plan = role_plan(colocated, engines, tp)
    assert check_role_plan(TOPOLOGY, plan, GRPO) == []
    layout = pack(shape_of_plan(TOPOLOGY, plan))
    assert [slot.node for slot in layout.engines] == engine_nodes
    assert_placed_as_the_layout_says(layout, rank_nodes)


def engines_ray_places(plan: RolePlan, expected: int) -> int:
    """Ray's own count, without the packing: the policy's whole-node group, then one STRICT_PACK group of TP*PP*DP
    GPUs per engine wherever Ray fits it (colocated engines may use the policy's nodes: here, all of them).

    Waits as long as it takes for the `expected` groups, then briefly for any more (which would be a surplus)."""
    width = plan.inference_engine_tensor_parallel_size * plan.inference_engine_pipeline_parallel_size
    width *= plan.inference_engine_data_parallel_size
    bundle = {"GPU": 1.0, "CPU": 1.0}
    policy = [] if plan.colocate_all else [placement_group([bundle] * GPUS, "STRICT_PACK")]
    ray.get([g.ready() for g in policy])
    engines = [placement_group([bundle] * width, "STRICT_PACK") for _ in range(plan.num_inference_engines)]
    pending = [g.ready() for g in engines]
    placed = 0
    if expected:
        ready, pending = ray.wait(pending, num_returns=expected, timeout=60)
        placed = len(ready)
    if pending:
        surplus, _ = ray.wait(pending, num_returns=len(pending), timeout=SURPLUS_WAIT_S)
        placed += len(surplus)
    for group in policy + engines:
        remove_placement_group(group)
    return placed


@pytest.mark.slow
def test_a_layout_preflight_accepts_is_placed_and_one_it_refuses_for_packing_is_not(
    rank_nodes: dict[int, str],
) -> None:
    rng = random.Random(11)
    plans = []
    for _ in range(30):
        colocated = rng.random() < 0.5
        tp, pp, dp = rng.choice([1, 2, 3, 4, 5, 8]), rng.choice([1, 1, 2]), rng.choice([1, 1, 2, 3])
        # Half the plans size the engines to the GPUs they may use, as a user would; the rest are arbitrary.
        sized = max((2 if colocated else 1) * GPUS // (tp * pp * dp), 1)
        plans.append(role_plan(colocated, rng.choice([sized, rng.randint(1, 9)]), tp, pp, dp))
    plans.append(role_plan(True, 1, 8, dp=2))  # the GPU counts add up, but a 16-GPU engine fits no node
    accepted = refused_for_packing = 0
    for plan in plans:
        shape = shape_of_plan(TOPOLOGY, plan)
        fit = min(shape.engines, shape.engines_that_fit)
        # The packing's count is Ray's count: no fewer engines placed (a layout it accepts is placeable), and
        # no more (one it refuses is not).
        assert engines_ray_places(plan, fit) == fit, plan
        violations = check_role_plan(TOPOLOGY, plan, GRPO)
        if not violations:
            accepted += 1
            assert_placed_as_the_layout_says(pack(shape), rank_nodes)
        if any("do not pack" in v.message for v in violations):
            refused_for_packing += 1
            assert fit < shape.engines
            with pytest.raises(PackingError):
                pack(shape)
    print(f"{len(plans)} plans: {accepted} accepted, {refused_for_packing} refused for packing")
    assert accepted >= 5 and refused_for_packing >= 1, (accepted, refused_for_packing)


def test_worker_lines_are_plain_text_in_a_log_file_and_coloured_in_a_terminal() -> None:
    environ: dict[str, str] = {}
    plain_worker_logs(environ, tty=True)
    assert environ == {}  # a terminal: Ray's colours
    plain_worker_logs(environ, tty=False)
    assert environ == {"RAY_COLOR_PREFIX": "0"}
    chosen = {"RAY_COLOR_PREFIX": "1"}
    plain_worker_logs(chosen, tty=False)
    assert chosen == {"RAY_COLOR_PREFIX": "1"}  # a person's explicit choice stays


@pytest.mark.parametrize(
    ("placement", "generator", "entrypoint", "backend", "shared"),
    [
        ({}, {}, "grpo", "torch", True),  # the tiny default: one rank, one engine, colocated
        ({}, {}, "fully_async", "torch", False),  # generates while the policy trains: two processes
        ({}, {}, "grpo", "vllm", False),  # vLLM runs in processes of its own
        ({"colocate_all": False}, {}, "grpo", "torch", False),
        ({"policy_num_gpus_per_node": 2}, {"num_inference_engines": 2}, "grpo", "torch", False),
        ({"policy_num_gpus_per_node": 2}, {"inference_engine_tensor_parallel_size": 2}, "grpo", "torch", False),
    ],
    ids=["colocated", "fully_async", "vllm", "separate", "two-ranks", "tp2"],
)
def test_only_a_single_rank_s_colocated_torch_engine_shares_its_process(
    placement: dict[str, object], generator: dict[str, object], entrypoint: str, backend: str, shared: bool
) -> None:
    recipe = Recipe.model_validate(
        {"trainer": {"entrypoint": entrypoint, "placement": placement}, "generator": generator}
    )
    gpus = recipe.trainer.placement.policy_num_gpus_per_node
    nodes = 1 if recipe.trainer.placement.colocate_all else 2
    layout = pack(shape_of_recipe(recipe, nodes, gpus))
    assert shares_process(recipe, layout, backend) is shared


def test_only_always_forces_a_one_process_layout_onto_ray_and_a_typo_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(FORCE_RAY_ENV, raising=False)
    assert forced_onto_ray() is False
    monkeypatch.setenv(FORCE_RAY_ENV, "always")
    assert forced_onto_ray() is True
    monkeypatch.setenv(FORCE_RAY_ENV, "1")
    with pytest.raises(TrainerError, match=r"RLBUILD_TRAINER_RAY='1' is not a value it takes: `always` runs"):
        forced_onto_ray()


def test_the_driver_starts_ray_before_torch_and_leaves_the_workers_imports_to_them() -> None:
    """`python -m trainer run` starts its private Ray from trainer/workers/cluster.py before it imports the loop:
    that module (and the start-up clock) must not pull torch in. The driver never imports what only the actors use,
    and every module a private Ray's workers import ahead exists (Ray only logs a preload that fails)."""
    script = (
        "import importlib.util, sys; from trainer.workers import cluster; from trainer.workers import startup; "
        "early = sorted({'torch', 'transformers'} & set(sys.modules)); "
        "import trainer.loop; "
        "driver = sorted({'torch.distributed.checkpoint', 'transformers.modeling_utils'} & set(sys.modules)); "
        "assert not early and not driver, f'cluster imported {early}, the driver {driver}'; "
        "missing = [name for name in cluster.ACTOR_IMPORTS if importlib.util.find_spec(name) is None]; "
        "assert not missing, f'no module {missing}'"
    )
    subprocess.run([sys.executable, "-c", script], check=True)
