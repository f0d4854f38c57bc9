"""The torch engine: sampling, logprobs that match the trainer's recomputation, and checked weight sync."""

from __future__ import annotations

import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

from rlbuild.dev.launches import base_model_dir
from trainer import tasks
from trainer.errors import TrainerError
from trainer.workers import engines, weight_sync
from trainer.workers.batch import build_batch
from trainer.workers.engines import SamplingParams, TorchEngine
from trainer.workers.policy import forward_logprobs
from trainer.workers.sharding import free_port


@pytest.fixture(autouse=True)
def loopback_choice_undone(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests play a weight-sync actor in the test's own process: the loopback interface an actor picks for
    its process (weight_sync.prefer_loopback) is undone after each."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return base_model_dir(0)


def _prompts(model_dir: Path, n: int = 6) -> list[list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer(r["prompt"])["input_ids"] for r in tasks.generate("addition", "validation", "seed-0")[:n]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_rollout_logprobs_match_the_trainer_recomputation(model_dir: Path, temperature: float) -> None:
    engine = TorchEngine(model_dir)
    prompts = [*_prompts(model_dir), [1, 20, 19, 30, 25, 74]]  # a longer prompt forces left padding
    rollouts = engine.generate(prompts, SamplingParams(max_tokens=4, temperature=temperature), seed=0)
    batch = build_batch(prompts, rollouts, engine.pad_id)
    with torch.no_grad():
        recomputed, _ = forward_logprobs(engine.model, batch, temperature, False)
    mask = batch["completion_mask"]
    assert float(((recomputed - batch["rollout_logprobs"]).abs() * mask).max()) < 1e-5


def test_generation_is_seeded_and_stops_at_eos(model_dir: Path) -> None:
    engine = TorchEngine(model_dir)
    prompts = _prompts(model_dir) * 4
    params = SamplingParams(max_tokens=4, temperature=1.0)
    first = engine.generate(prompts, params, seed=7)
    assert [r.token_ids for r in first] == [r.token_ids for r in engine.generate(prompts, params, seed=7)]
    assert [r.token_ids for r in first] != [r.token_ids for r in engine.generate(prompts, params, seed=8)]
    for rollout in first:
        assert rollout.finished == (rollout.token_ids[-1] == engine.eos_id)
        assert engine.eos_id not in rollout.token_ids[:-1]
        assert len(rollout.token_ids) == len(rollout.logprobs) <= 4


def test_top_k_one_is_greedy(model_dir: Path) -> None:
    engine = TorchEngine(model_dir)
    prompts = _prompts(model_dir)
    greedy = engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0), seed=0)
    top1 = engine.generate(prompts, SamplingParams(max_tokens=4, temperature=1.0, top_k=1), seed=3)
    assert [r.token_ids for r in greedy] == [r.token_ids for r in top1]


def test_top_p_keeps_the_smallest_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    kept = engines._filter_logits(logits, top_p=0.6, top_k=-1)
    assert torch.isfinite(kept).tolist() == [[True, True, False]]
    assert torch.isfinite(engines._filter_logits(logits, top_p=0.4, top_k=-1)).tolist() == [[True, False, False]]


def _sync_and_compare(engine: TorchEngine, policy: torch.nn.Module, sequence: list[int]) -> float:
    ids = torch.tensor([sequence])
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": ids[:, 3:]}
    with torch.no_grad():
        expected = forward_logprobs(policy, batch, 1.0, False)[0][0].tolist()
    return engines.max_abs_difference(expected, engine.sequence_logprobs(sequence, 3))


def _perturb(model: torch.nn.Module) -> None:
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * 0.05)


SEQUENCE = [1, 7, 67, 8, 69, 15, 2]


def _vllm_engine(model_dir: Path) -> engines.VLLMEngine:
    return engines.VLLMEngine(
        model_dir,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        data_parallel_size=1,
        expert_parallel_size=1,
        gpu_memory_utilization=0.3,
        enforce_eager=True,
        seed=0,
        max_model_len=64,
    )


NEEDS_VLLM = pytest.mark.skipif(
    not (engines.vllm_available() and torch.cuda.is_available()),
    reason="the vLLM engine needs vllm installed and a GPU (neither is on the CPU CI box)",
)
# (engine factory, how close its logprobs must come to the policy's after a sync)
ENGINES = {"torch": (TorchEngine, 1e-5), "vllm": (_vllm_engine, 1e-3)}


def _engine_behind_a_trained_policy(model_dir: Path, backend: str = "torch") -> tuple[Any, torch.nn.Module]:
    """An engine on the base weights and a policy whose weights moved on (their logprobs differ)."""
    engine = ENGINES[backend][0](model_dir)
    policy = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    _perturb(policy)
    assert _sync_and_compare(engine, policy, SEQUENCE) > 1e-3
    return engine, policy


def test_weight_sync_makes_engine_logprobs_equal_policy_logprobs(model_dir: Path) -> None:
    engine, policy = _engine_behind_a_trained_policy(model_dir)
    engine.load_weights(policy.state_dict())
    assert _sync_and_compare(engine, policy, SEQUENCE) < 1e-5


@pytest.mark.parametrize("backend", ["torch", pytest.param("vllm", marks=NEEDS_VLLM)])
def test_weights_broadcast_over_a_gloo_group_reach_the_engine(model_dir: Path, backend: str) -> None:
    """The sync path the trainer runs: policy rank 0 broadcasts, the engine receives into its own weights."""
    engine, policy = _engine_behind_a_trained_policy(model_dir, backend)
    state = policy.state_dict()
    port = free_port()
    sender = threading.Thread(
        target=lambda: weight_sync.send(weight_sync.open_group("gloo", "127.0.0.1", port, 0, 2), state, "gloo")
    )
    sender.start()
    engine.open_weight_sync("gloo", "127.0.0.1", port, first_rank=1, world_size=2)
    engine.receive_weights(weight_sync.specs_of(state))
    sender.join(timeout=60)
    assert not sender.is_alive()
    assert _sync_and_compare(engine, policy, SEQUENCE) < ENGINES[backend][1]
    rollouts = engine.generate([SEQUENCE[:5]] * 4, SamplingParams(max_tokens=3), seed=0)
    assert all(math.isfinite(lp) for r in rollouts for lp in r.logprobs)


def test_weights_travel_in_buckets_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Packing tensors into buckets changes how many broadcasts a sync takes, not one bit of what arrives."""
    generator = torch.Generator().manual_seed(0)
    state = {
        "a.weight": torch.randn(3, 5, generator=generator),
        "b.bias": torch.randn(7, generator=generator),
        "c.scale": torch.randn(2, 2, generator=generator).to(torch.bfloat16),
        "d.big": torch.randn(40, generator=generator),
        "e.steps": torch.arange(4),
    }
    specs = weight_sync.specs_of(state)
    # 64 bytes a bucket: a and b (15 + 7 floats) split, d (160 bytes) goes alone, dtypes never mix.
    assert [[s.name for s in b] for b in weight_sync.buckets(specs, limit=64)] == [
        ["a.weight"],
        ["b.bias"],
        ["c.scale"],
        ["d.big"],
        ["e.steps"],
    ]
    assert [len(b) for b in weight_sync.buckets(specs, limit=1 << 20)] == [2, 1, 1, 1]
    monkeypatch.setattr(weight_sync, "BUCKET_BYTES", 100)
    sent: list[int] = []

    class Counting:  # the real gloo group, counting its broadcasts
        def __init__(self, group: Any) -> None:
            self.group = group

        def broadcast(self, tensor: torch.Tensor, root: int) -> Any:
            sent.append(tensor.numel())
            return self.group.broadcast(tensor, root)

    port = free_port()
    sender = threading.Thread(
        target=lambda: weight_sync.send(
            Counting(weight_sync.open_group("gloo", "127.0.0.1", port, 0, 2)), state, "gloo"
        )
    )
    sender.start()
    received = dict(weight_sync.receive(weight_sync.open_group("gloo", "127.0.0.1", port, 1, 2), specs, "gloo"))
    sender.join(timeout=60)
    assert sent == [22, 4, 40, 4]  # a + b (88 bytes), c, d, e: four broadcasts for five tensors
    assert received.keys() == state.keys()
    for name, tensor in state.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor), name


def test_an_unknown_weight_sync_backend_is_named() -> None:
    with pytest.raises(TrainerError, match="weight_sync_backend='mpi' is not supported"):
        weight_sync.open_group("mpi", "127.0.0.1", free_port(), 0, 1)


def test_weight_sync_keeps_tied_embeddings_tied(tmp_path: Path) -> None:
    config = Qwen2Config(
        vocab_size=80,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path)
    engine = TorchEngine(tmp_path)
    policy = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    _perturb(policy)
    assert policy.lm_head.weight.data_ptr() == policy.model.embed_tokens.weight.data_ptr()
    engine.load_weights(policy.state_dict())
    assert engine.model.lm_head.weight.data_ptr() == engine.model.model.embed_tokens.weight.data_ptr()
    assert _sync_and_compare(engine, policy, [1, 5, 6, 7, 8, 2]) < 1e-5


def test_load_weights_rejects_foreign_names(model_dir: Path) -> None:
    engine = TorchEngine(model_dir)
    with pytest.raises(engines.EngineError, match="unexpected"):
        engine.load_weights({"transformer.wte.weight": torch.zeros(1)})


def test_backend_resolution() -> None:
    assert engines.resolve_backend("torch") == "torch"
    assert engines.resolve_backend("auto", gpu=False) == "torch"
    if engines.vllm_available():
        assert engines.resolve_backend("auto", gpu=True) == "vllm"
    else:
        with pytest.raises(
            engines.EngineError, match=r"vllm is not installed; install it with `scripts/setup\.sh --extra gpu`"
        ):
            engines.resolve_backend("vllm")
        with pytest.raises(engines.EngineError, match="'auto' means vLLM on a GPU, and this runtime has no vllm"):
            engines.resolve_backend("auto", gpu=True)
