"""The role-plan arithmetic on the seed's worked examples."""

from __future__ import annotations

from rlbuild.roleplan import check_role_plan, geometry
from rlbuild.spec import RolePlan, Runtime, Topology
from tests.spine.experiments import SEED_64_GPU, experiment

GRPO = Runtime(entrypoint="grpo", strategy="fsdp2")


def parts(doc: dict) -> tuple[Topology, RolePlan]:
    return Topology(**doc["topology"]), RolePlan(**doc["role_plan"])


def test_four_policy_nodes_and_four_node_sized_engines_use_64_gpus() -> None:
    topology, plan = parts(SEED_64_GPU)
    assert check_role_plan(topology, plan, GRPO) == []
    g = geometry(topology, plan)
    assert (g.policy_gpus, g.rollout_gpus, g.planned_gpus, g.allocated_gpus) == (32, 32, 64, 64)


def test_rollout_dp_one_is_rejected_as_36_gpus() -> None:
    topology, plan = parts(experiment(role_plan__inference_engine_data_parallel_size=1))
    (violation,) = check_role_plan(topology, plan, GRPO)
    assert violation.field == "role_plan.inference_engine_data_parallel_size"
    assert violation.message == "rollout DP=1 describes 36 of 64 GPUs"
    assert violation.fix.startswith("inference_engine_data_parallel_size=8 would consume them")


def test_marin_example_one_wide_expert_parallel_engine_on_five_nodes() -> None:
    doc = experiment(
        topology__num_nodes=5,
        role_plan__num_inference_engines=1,
        role_plan__inference_engine_data_parallel_size=8,
        role_plan__inference_engine_expert_parallel_size=8,
    )
    topology, plan = parts(doc)
    assert check_role_plan(topology, plan, GRPO) == []
    assert geometry(topology, plan).planned_gpus == 40


def test_separate_reference_nodes_count_towards_the_total() -> None:
    doc = experiment(role_plan__ref_num_nodes=1)
    topology, plan = parts(doc)
    (violation,) = check_role_plan(topology, plan, GRPO)
    assert violation.message == "rollout DP=8 describes 72 of 64 GPUs"
    assert violation.fix.endswith("topology.num_nodes=9 would match the plan")
    topology, plan = parts(experiment(role_plan__ref_num_nodes=1, topology__num_nodes=9))
    assert check_role_plan(topology, plan, GRPO) == []


def test_colocated_plan_counts_policy_gpus_once() -> None:
    doc = experiment(
        role_plan__colocate_all=True,
        role_plan__policy_num_nodes=8,
        role_plan__num_inference_engines=8,
        role_plan__inference_engine_tensor_parallel_size=8,
        role_plan__inference_engine_data_parallel_size=1,
    )
    topology, plan = parts(doc)
    assert check_role_plan(topology, plan, GRPO) == []
    assert geometry(topology, plan).planned_gpus == 64


def test_fully_async_with_equal_batches_and_separate_roles_passes() -> None:
    topology, plan = parts(experiment(role_plan__train_batch_size=16))
    assert check_role_plan(topology, plan, Runtime(entrypoint="fully_async", strategy="fsdp2")) == []


def test_tensor_parallel_size_must_divide_the_models_heads() -> None:
    from rlbuild.preflight import check_model_shape
    from rlbuild.spec import parse_experiment

    doc = parse_experiment(experiment(role_plan__inference_engine_tensor_parallel_size=8), "t")
    (violation,) = check_model_shape({"num_attention_heads": 12, "num_key_value_heads": 4}, doc)
    assert violation.message == "TP=8 does not divide the model's num_attention_heads=12, so vLLM cannot shard it"
    assert check_model_shape({"num_attention_heads": 32, "num_key_value_heads": 4}, doc) == []
