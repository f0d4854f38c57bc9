"""FSDP2 on CPU ranks through the real roles on a local Ray: a sharded step equals the one-rank step, and a
sharded checkpoint loads into another world size (torch.distributed.checkpoint reshards it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlbuild.contracts.launch import LaunchDocument, load_launch
from rlbuild.contracts.manifest import MANIFEST, ManifestMismatchError, read_manifest
from rlbuild.core import storage
from rlbuild.dev.launches import write_test_launch
from tests.launches import placeable
from trainer import tasks
from trainer.workers import grpo
from trainer.workers.batch import UpdateBatch, update_batch
from trainer.workers.cluster import connect, layout_of
from trainer.workers.engines import SamplingParams, TorchEngine
from trainer.workers.placement import place_roles, setup_group
from trainer.workers.policy import score
from trainer.workers.reference import ReferenceWorker
from trainer.workers.roles import Roles

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
MICRO = 16  # samples per micro-batch: the one rank takes 2 of them, each of two ranks 1


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    started = connect(None, num_bundles=4)
    yield
    if started:
        ray.shutdown()


def _launch(tmp_path: Path, ranks: int) -> LaunchDocument:
    """The test experiment on one node of `ranks` CPU "GPUs": the policy on all of them, one engine each."""
    role_plan = {"policy_num_gpus_per_node": ranks, "num_inference_engines": ranks}
    path = write_test_launch(tmp_path / f"ranks-{ranks}", topology={"gpus_per_node": ranks}, role_plan=role_plan)
    return load_launch(str(path))


def _batch(launch: LaunchDocument) -> UpdateBatch:
    """One step's rollouts of the base model on 4 prompts x 8 samples, with rewards that differ in every group."""
    model_dir = Path(launch.inputs.model.uri)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = tasks.generate("addition", "train", "seed-0")[:4]
    n = launch.recipe.generator.n_samples_per_prompt
    prompts = [tokenizer(row["prompt"])["input_ids"] for row in rows for _ in range(n)]
    rollouts = TorchEngine(model_dir).generate(prompts, SamplingParams(max_tokens=4), seed=3)
    rewards = torch.tensor([float(i % 3 == 0) for i in range(len(prompts))])
    advantages = grpo.group_advantages(rewards, n, True)
    return update_batch(prompts, rollouts, rewards, advantages, launch.recipe, tokenizer.pad_token_id)


def _weights(roles: Roles, uri: Path) -> dict[str, torch.Tensor]:
    storage.write_json(str(uri / MANIFEST), {"files": roles.save_checkpoint(str(uri), with_hf_folder=True)})
    return load_file(uri / "policy" / "model.safetensors")


def _load_into(
    roles: dict[int, Roles], ranks: int, checkpoint: Path, batch: UpdateBatch, out: Path
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Step `roles[ranks]` once, load `checkpoint` into it, step both: (1-rank weights, 2-rank weights)."""
    roles[ranks].update(batch, 1, MICRO)
    roles[ranks].load_checkpoint(str(checkpoint), read_manifest(str(checkpoint))["files"])
    for r in roles.values():
        r.update(batch, 1, MICRO)
    return _weights(roles[1], out / "one"), _weights(roles[2], out / "two")


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@placeable(3)
def test_two_sharded_ranks_step_like_one_rank_and_checkpoints_load_across_world_sizes(
    tmp_path: Path, local_ray: None
) -> None:
    launches = {ranks: _launch(tmp_path, ranks) for ranks in (1, 2)}
    batch = _batch(launches[1])
    roles = {
        ranks: place_roles(launch.recipe, layout_of(launch), launch.inputs.model.uri, str(tmp_path / "cache"), "torch")
        for ranks, launch in launches.items()
    }
    try:
        # The base model as staged (a checkpoint before the first step would initialise AdamW's state early).
        initial = load_file(Path(launches[1].inputs.model.uri) / "model.safetensors")
        assert launches[1].recipe.trainer.micro_train_batch_size_per_gpu == MICRO
        stats = {ranks: r.update(batch, 1, MICRO) for ranks, r in roles.items()}
        one, two = _weights(roles[1], tmp_path / "one"), _weights(roles[2], tmp_path / "two")
        assert _max_difference(initial, one) > 1e-4, "the step must move the weights for the comparison to mean much"
        assert _max_difference(one, two) < 1e-5
        for key in ("pg_loss", "kl", "grad_norm", "entropy"):
            assert stats[2][key] == pytest.approx(stats[1][key], rel=1e-4, abs=1e-6), key
        assert {p.name for p in (tmp_path / "two" / "sharded").iterdir()} == {
            ".metadata",
            "__0_0.distcp",
            "__1_0.distcp",
        }

        # Load each world size's checkpoint into the other, after moving the loading side elsewhere: weights, AdamW
        # moments and the schedule come back resharded, so the next step is the checkpointed run's next step.
        after = _load_into(roles, 2, tmp_path / "one", batch, tmp_path / "after")
        assert _max_difference(one, after[0]) > 1e-4
        assert _max_difference(*after) < 1e-5
        last = _load_into(roles, 1, tmp_path / "after" / "two", batch, tmp_path / "last")
        assert _max_difference(after[1], last[1]) > 1e-4
        assert _max_difference(*last) < 1e-5

        # One flipped bit in a shard: the resume refuses, naming the file, before any rank loads.
        shard = tmp_path / "last" / "two" / "sharded" / "__1_0.distcp"
        payload = bytearray(shard.read_bytes())
        payload[len(payload) // 2] ^= 0x01
        shard.write_bytes(bytes(payload))
        checkpoint = tmp_path / "last" / "two"
        with pytest.raises(ManifestMismatchError, match=r"sharded/__1_0\.distcp: sha256"):
            roles[2].load_checkpoint(str(checkpoint), read_manifest(str(checkpoint))["files"])
    finally:
        for r in roles.values():
            r.shutdown()


def test_a_sharded_reference_scores_an_uneven_batch_like_the_whole_model(tmp_path: Path, local_ray: None) -> None:
    launch = _launch(tmp_path, 1)
    batch = {k: v[:31] for k, v in _batch(launch).tensors.items()}  # 31 rows: the second worker's share is topped up
    recipe, uri = launch.recipe, launch.inputs.model.uri
    workers = [ray.remote(ReferenceWorker).remote(i, 2, recipe, uri, str(tmp_path / "cache"), 1) for i in range(2)]
    try:
        assert setup_group(workers).startswith("fsdp2 on 2 ranks (cpu, gloo): fully_shard")
        scored = Roles(policy=[], engines=[], reference=workers, groups=[]).reference_logprobs(batch)
    finally:
        ray.get([w.shutdown.remote() for w in workers])
        for worker in workers:
            ray.kill(worker)
    whole = AutoModelForCausalLM.from_pretrained(Path(uri), dtype=torch.float32).eval()
    temperature = recipe.generator.sampling_params.temperature
    expected = score(whole, batch, temperature, recipe.trainer.micro_forward_batch_size_per_gpu)
    assert scored.shape == expected.shape == batch["completion_mask"].shape
    assert torch.allclose(scored, expected, atol=1e-5)
    assert float(expected.abs().sum()) > 1.0
