"""The role-plan arithmetic on the seed's worked examples."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlbuild.cli import main
from rlbuild.contracts.layout import EngineSlot, PackingError, pack
from rlbuild.plan.roleplan import check_role_plan, geometry, shape_of_plan
from rlbuild.plan.spec import RolePlan, Runtime, Topology
from tests.spine.experiments import SEED_64_GPU, experiment, write

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
    assert violation.message == (
        "the plan describes 72 of 64 allocated GPUs (policy 32 + reference 8 + rollout 4*1*1*8=32)"
    )
    # DP=6 would consume the 24 free GPUs, but four 6-GPU engines do not pack onto 3 free 8-GPU nodes: not offered.
    assert violation.fix == ("num_inference_engines=3 would consume them or topology.num_nodes=9 would match the plan")
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
    from rlbuild.plan.modelcheck import check_model
    from rlbuild.plan.preflight import parse_experiment

    doc = parse_experiment(experiment(role_plan__inference_engine_tensor_parallel_size=8), "t")
    (violation,) = check_model({"num_attention_heads": 12, "num_key_value_heads": 4}, doc, None)
    assert violation.message == "TP=8 does not divide the model's num_attention_heads=12, so vLLM cannot shard it"
    assert check_model({"num_attention_heads": 32, "num_key_value_heads": 4}, doc, None) == []


def _engines_on_three_free_nodes(engines: int, tp: int) -> dict:
    """The seed's 4 policy nodes on 7 nodes of 8 GPUs: 3 nodes (24 GPUs) left for the engines."""
    return experiment(
        topology__num_nodes=7,
        role_plan__num_inference_engines=engines,
        role_plan__inference_engine_tensor_parallel_size=tp,
        role_plan__inference_engine_data_parallel_size=1,
    )


def test_check_rejects_engines_that_do_not_pack_and_accepts_those_that_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 8 x TP=3 is 24 GPUs, exactly the free ones, but an engine stays on one node: only 2 fit per 8-GPU node.
    refused = write(tmp_path, _engines_on_three_free_nodes(8, 3), "tp3.yaml")
    assert main(["check", str(refused), "--json", "--storage-root", str(tmp_path / "s")]) == 2
    (error,) = json.loads(capsys.readouterr().out)["errors"]
    assert error["field"] == "role_plan.num_inference_engines"
    assert "2 fit per node, 6 in all" in error["message"]
    assert "TP=4 with num_inference_engines=6" in error["fix"] and "TP=2 with num_inference_engines=12" in error["fix"]
    accepted = write(tmp_path, _engines_on_three_free_nodes(6, 4), "tp4.yaml")
    assert main(["check", str(accepted), "--json", "--storage-root", str(tmp_path / "s")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    (plan,) = report["plans"].values()
    assert plan["geometry"]["layout"] == (
        "policy nodes 0-3; engines on nodes 4-6, up to 2 per node, 4 GPU(s) each on one node"
    )


def test_every_suggested_packing_fix_is_accepted() -> None:
    topology, plan = parts(_engines_on_three_free_nodes(8, 3))
    (violation,) = check_role_plan(topology, plan, GRPO)
    for suggestion in ("TP=2 with num_inference_engines=12", "TP=4 with num_inference_engines=6"):
        assert suggestion in violation.fix
        tp, engines = (int(part.split("=")[1]) for part in suggestion.split(" with "))
        fixed = plan.model_copy(update={"inference_engine_tensor_parallel_size": tp, "num_inference_engines": engines})
        assert check_role_plan(topology, fixed, GRPO) == []


def test_engines_pack_first_fit_onto_the_free_nodes() -> None:
    layout = pack(shape_of_plan(*parts(_engines_on_three_free_nodes(6, 4))))
    assert layout.policy_nodes == (0, 1, 2, 3)
    assert layout.engines == tuple(EngineSlot(node, gpu, 4) for node in (4, 5, 6) for gpu in (0, 4))
    with pytest.raises(PackingError, match="2 fit per node, 6 in all"):
        pack(shape_of_plan(*parts(_engines_on_three_free_nodes(8, 3))))


def test_a_separate_reference_takes_the_nodes_after_the_policy() -> None:
    topology, plan = parts(experiment(role_plan__ref_num_nodes=1, topology__num_nodes=9))
    layout = pack(shape_of_plan(topology, plan))
    assert (layout.policy_nodes, layout.reference_nodes) == ((0, 1, 2, 3), (4,))
    assert [slot.node for slot in layout.engines] == [5, 6, 7, 8]
    assert layout.reference_worker(7) == (4, 7) and layout.policy_rank(9) == (1, 1)


def test_colocated_engines_tile_the_policy_nodes_dp_replicas_together() -> None:
    doc = experiment(
        role_plan__colocate_all=True,
        role_plan__policy_num_nodes=8,
        role_plan__num_inference_engines=16,
        role_plan__inference_engine_tensor_parallel_size=2,
        role_plan__inference_engine_data_parallel_size=2,
        role_plan__inference_engine_expert_parallel_size=4,
    )
    topology, plan = parts(doc)
    assert check_role_plan(topology, plan, GRPO) == []
    layout = pack(shape_of_plan(topology, plan))
    assert [(s.node, s.gpu_indices) for s in layout.engines[:3]] == [
        (0, (0, 1, 2, 3)),
        (0, (4, 5, 6, 7)),
        (1, (0, 1, 2, 3)),
    ]
    # Three-GPU engines (TP 1, DP 3) cover 24 policy GPUs only by spanning nodes, which an engine never does.
    doc = experiment(
        topology__num_nodes=3,
        role_plan__colocate_all=True,
        role_plan__policy_num_nodes=3,
        role_plan__num_inference_engines=8,
        role_plan__inference_engine_data_parallel_size=3,
        role_plan__policy_mini_batch_size=24,
        role_plan__train_batch_size=48,
    )
    (violation,) = check_role_plan(*parts(doc), GRPO)
    assert violation.message.endswith(
        "onto the policy's 3 8-GPU node(s) (nodes 0-2): an engine stays on one node, so 2 fit per node, 6 in all"
    )
    assert "DP=4 with num_inference_engines=6" in violation.fix
