"""The policy's forward paths: shared-prompt forwards and trimmed micro-batches change cost, never results."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlbuild.dev.launches import base_model_dir
from trainer import tasks
from trainer.workers.batch import build_batch
from trainer.workers.engines import SamplingParams, TorchEngine
from trainer.workers.policy import _take, forward_logprobs

GROUP = 4


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return base_model_dir(0)


@pytest.fixture(scope="module")
def batch(model_dir: Path) -> dict[str, torch.Tensor]:
    """Three GRPO groups of sampled completions, one with a longer prompt (so the others are left-padded)."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = [*tasks.generate("addition", "validation", "seed-0")[:2], {"prompt": "12+34=", "answer": "46"}]
    prompts = [tokenizer(r["prompt"])["input_ids"] for r in rows for _ in range(GROUP)]
    rollouts = TorchEngine(model_dir).generate(prompts, SamplingParams(max_tokens=4, temperature=1.0), seed=0)
    return build_batch(prompts, rollouts, tokenizer.pad_token_id)


def _logprobs_and_grads(
    model: torch.nn.Module, batch: dict[str, torch.Tensor], share_prompts: bool
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logp, entropy = forward_logprobs(model, batch, 0.8, True, share_prompts=share_prompts)
    assert entropy is not None
    mask = batch["completion_mask"]
    weights = torch.linspace(-1.0, 1.0, logp.numel()).view_as(logp)  # distinct per token, like advantages
    ((logp * weights + 0.1 * entropy) * mask).sum().backward()
    return logp * mask, entropy * mask, [p.grad.clone() for p in model.parameters()]


def test_shared_prompt_forward_gives_the_same_logprobs_and_gradients(
    model_dir: Path, batch: dict[str, torch.Tensor]
) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    plain_logp, plain_entropy, plain_grads = _logprobs_and_grads(model, batch, share_prompts=False)
    shared_logp, shared_entropy, shared_grads = _logprobs_and_grads(model, batch, share_prompts=True)
    assert torch.allclose(plain_logp, shared_logp, atol=1e-5)
    assert torch.allclose(plain_entropy, shared_entropy, atol=1e-5)
    for plain, shared in zip(plain_grads, shared_grads, strict=True):
        assert torch.allclose(plain, shared, atol=1e-4, rtol=1e-4)
    assert any(float(g.abs().max()) > 1e-3 for g in plain_grads), "the comparison must involve real gradients"


def _reference(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The plain computation: every position's logits, positions counted from the attention mask."""
    model.zero_grad(set_to_none=True)
    ids, attention, width = batch["input_ids"], batch["attention_mask"], batch["completion_mask"].shape[1]
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attention, position_ids=positions).logits[:, -width - 1 : -1]
    logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, ids[:, -width:, None]).squeeze(-1)
    mask = batch["completion_mask"]
    (logp * torch.linspace(-1.0, 1.0, logp.numel()).view_as(logp) * mask).sum().backward()
    return logp.detach() * mask, [p.grad.clone() for p in model.parameters()]


def test_the_lean_forward_gives_the_same_bits_on_every_real_token(
    model_dir: Path, batch: dict[str, torch.Tensor]
) -> None:
    """No explicit positions without left padding, logits only where a completion token is predicted."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    unpadded, _ = _take(batch, slice(0, GROUP))  # one prompt: no left padding once trimmed
    assert bool(unpadded["attention_mask"][:, 0].all()) and not bool(batch["attention_mask"][:, 0].all())
    for part in (unpadded, batch):
        expected_logp, expected_grads = _reference(model, part)
        model.zero_grad(set_to_none=True)
        logp = forward_logprobs(model, part, 1.0, False)[0]
        mask = part["completion_mask"]
        (logp * torch.linspace(-1.0, 1.0, logp.numel()).view_as(logp) * mask).sum().backward()
        assert torch.equal(logp.detach() * mask, expected_logp)
        assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), expected_grads, strict=True))


def test_a_micro_batch_drops_the_padding_columns_none_of_its_rows_use(
    model_dir: Path, batch: dict[str, torch.Tensor]
) -> None:
    batch = {**batch, "loss_weights": batch["completion_mask"] / 7, "advantages": torch.ones(len(batch["input_ids"]))}
    first_group = slice(0, GROUP)  # a short prompt: left padding to trim
    part, width = _take(batch, first_group)
    full_width = batch["completion_mask"].shape[1]
    prompt_width = batch["input_ids"].shape[1] - full_width
    assert part["input_ids"].shape[1] < batch["input_ids"].shape[1]
    assert bool(part["attention_mask"][:, 0].any()), "the first kept column is used by some row"
    assert width == int(batch["completion_mask"][first_group].sum(dim=1).max())
    for key in ("completion_mask", "rollout_logprobs", "loss_weights"):
        assert torch.equal(part[key], batch[key][first_group, :width])
    assert torch.equal(part["advantages"], batch["advantages"][first_group])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        whole = forward_logprobs(model, batch, 1.0, False)[0][first_group, :width]
        trimmed = forward_logprobs(model, part, 1.0, False)[0]
    mask = part["completion_mask"]
    assert torch.allclose(whole * mask, trimmed * mask, atol=1e-5)
    assert part["input_ids"].shape[1] == width + prompt_width - int(
        (batch["attention_mask"][first_group, :prompt_width].sum(dim=0) == 0).sum()
    )


def test_an_untrimmable_micro_batch_comes_back_whole(batch: dict[str, torch.Tensor]) -> None:
    part, width = _take(batch, slice(0, len(batch["input_ids"])))
    assert width == batch["completion_mask"].shape[1]
    assert all(torch.equal(part[k], batch[k]) for k in batch)
