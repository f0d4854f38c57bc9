"""The policy worker: one data-parallel rank of the policy (and its frozen reference), run as a Ray actor (or, a
layout of one process, in the trainer's own: placement.roles_in_process).

Ranks form a torch.distributed group (gloo on CPU, NCCL on GPU) and the model (with the reference it keeps) is
`fully_shard`ed over it, on CPU as on GPU (trainer/workers/sharding.py). Checkpoints are sharded (one DCP file per
rank); the weights the engines receive, and the HF folder of the terminal checkpoint, are the full state dict
gathered to rank 0.

A training batch arrives already sharded by the driver: for each optimizer mini-batch, this rank holds a
contiguous slice, with per-token loss weights that normalise over the *whole* mini-batch (see trainer/workers/grpo.py),
so the gradient is the same whatever the micro-batch size or number of ranks.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from trainer.workers import grpo, sharding
from trainer.workers.policy_weights import PolicyWeights

if TYPE_CHECKING:  # the recipe's schema needs pydantic, which a bare GPU node lacks (scripts/gpu_check.py)
    from rlbuild.contracts.recipe import Recipe


def forward_logprobs(
    model: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float,
    with_entropy: bool,
    share_prompts: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Completion-token logprobs [b, C] (and entropies) of [left-padded prompt | right-padded completion].

    `share_prompts` computes each distinct prompt once (see `_shared_prompt_logits`): same result, fewer tokens.
    """
    ids, attention = batch["input_ids"], batch["attention_mask"]
    completion_width = batch["completion_mask"].shape[1]
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    if share_prompts:
        logits = _shared_prompt_logits(model, ids, attention, positions, completion_width)
    else:
        # Without left padding the model numbers positions 0..n-1 itself (the same on every real token, and it
        # then skips looking for packed sequences), and only the logits that predict completion tokens are made:
        # ~20% less time per micro-batch forward and backward on the tiny model, the same bits on real tokens.
        left_padded = bool((attention[:, 0] == 0).any())
        logits = model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions if left_padded else None,
            logits_to_keep=completion_width + 1,
        ).logits[:, :-1]
    targets = ids[:, -completion_width:]
    if not with_entropy:
        return grpo.token_logprobs(logits, targets, temperature), None
    return grpo.logprobs_and_entropy(logits, targets, temperature)


def _shared_prompt_logits(
    model: torch.nn.Module, ids: torch.Tensor, attention: torch.Tensor, positions: torch.Tensor, completion_width: int
) -> torch.Tensor:
    """Logits predicting each completion token, running every distinct prompt once.

    A GRPO group is n samples of one prompt: the prompt's keys/values are computed once, with gradients, and
    every completion of the group attends to them, so the prompt costs 1/n of its tokens and gradients flow
    back through the shared cache exactly as through n copies. It takes two forwards even when no prompt
    repeats: sharded ranks must all run the same forwards, whatever their rows hold.
    """
    prompt_width = ids.shape[1] - completion_width
    prompts, inverse = torch.unique(ids[:, :prompt_width], dim=0, return_inverse=True)
    # The row of each distinct prompt's first occurrence (scatter keeps the last write: the lowest row).
    first = torch.empty(len(prompts), dtype=torch.long, device=ids.device)
    first.scatter_(0, inverse.flip(0), torch.arange(len(ids) - 1, -1, -1, device=ids.device))
    head = model(
        input_ids=prompts,
        attention_mask=attention[first, :prompt_width],
        position_ids=positions[first, :prompt_width],
        use_cache=True,
    )
    cache = head.cache
    cache.batch_select_indices(inverse)
    tail = model(
        input_ids=ids[:, prompt_width:],
        attention_mask=attention,
        position_ids=positions[:, prompt_width:],
        cache=cache,
        use_cache=False,
    )
    return torch.cat([head.logits[inverse, -1:], tail.logits[:, :-1]], dim=1)


@dataclass(frozen=True)
class LearningRateSchedule:
    """The learning-rate factor after n optimizer steps: linear warmup, then constant or cosine to min_lr_ratio."""

    kind: str  # constant_with_warmup | cosine_with_warmup
    warmup: int
    total: int
    min_ratio: float

    def __call__(self, n: int) -> float:
        if n < self.warmup:
            return (n + 1) / self.warmup
        if self.kind == "constant_with_warmup":
            return 1.0
        progress = min((n - self.warmup) / max(self.total - self.warmup, 1), 1.0)
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


@torch.no_grad()
def score(model: torch.nn.Module, batch: dict[str, torch.Tensor], temperature: float, chunk_rows: int) -> torch.Tensor:
    """No-grad completion logprobs [b, C] of a whole batch, `chunk_rows` rows per forward, prompts shared."""
    out = torch.zeros(batch["completion_mask"].shape, device=batch["completion_mask"].device)
    for start in range(0, out.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        part, kept = _take(batch, rows)
        out[rows, :kept] = forward_logprobs(model, part, temperature, False, share_prompts=True)[0]
    return out


class PolicyWorker(PolicyWeights, sharding.Rank):
    """A policy rank: setup, then the GRPO update (`train_step`, top to bottom below); what it does with its weights
    besides updating them (the sync to the engines, checkpoints, the HF folder) is PolicyWeights'."""

    def __init__(
        self, rank: int, world_size: int, recipe: Recipe, model_uri: str, cache_dir: str, num_threads: int
    ) -> None:
        super().__init__(rank, world_size, model_uri, cache_dir, num_threads)
        self.recipe = recipe

    def setup(self, master_addr: str, master_port: int) -> str:
        """Join the policy's group, load and shard the model (and its reference); says how it is sharded."""
        self.join_group(master_addr, master_port)
        trainer = self.recipe.trainer
        torch.manual_seed(trainer.seed)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).to(self.device)
        self.ref = None
        if trainer.algorithm.use_kl_loss and self.recipe.reference_workers == 0:
            self.ref = copy.deepcopy(self.model).eval().requires_grad_(False)
        described = sharding.shard([self.model] if self.ref is None else [self.model, self.ref], self.device)
        self.optimizer, self.scheduler = self._optimizer()
        return described

    def _optimizer(self) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
        trainer = self.recipe.trainer
        opt = trainer.policy.optimizer_config
        optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=opt.lr,
            betas=(opt.adam_betas[0], opt.adam_betas[1]),
            weight_decay=opt.weight_decay,
            fused=True,  # one kernel for all parameters (CPU and CUDA); the per-tensor loop costs ~2 ms a step here
        )
        minis = trainer.train_batch_size // trainer.policy_mini_batch_size
        total = trainer.max_steps * minis * trainer.update_epochs_per_batch
        schedule = LearningRateSchedule(opt.scheduler, opt.num_warmup_steps, total, opt.min_lr_ratio)
        return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)

    # ------------------------------------------------------------------ training

    def train_step(self, shard: dict[str, torch.Tensor], minis: int, micro: int) -> dict[str, float]:
        """One global step on this rank's shard: `minis` optimizer steps (x update epochs) of micro-batches."""
        shard = {k: v.to(self.device) for k, v in shard.items()}
        ref, old = self._scores(shard, minis)
        old_seen = torch.zeros_like(shard["completion_mask"])
        sums = {name: torch.zeros((), device=self.device) for name in _SUMMED}
        per_mini = shard["input_ids"].shape[0] // minis
        grad_norms, lrs = [], []
        self.model.train()
        for epoch in range(self.recipe.trainer.update_epochs_per_batch):
            for m in range(minis):
                rows = range(m * per_mini, (m + 1) * per_mini)
                seen = old_seen if epoch == 0 else None
                lrs.append(self.scheduler.get_last_lr()[0])  # the rate this optimizer step uses
                grad_norms.append(self._optimizer_step(shard, rows, micro, old, ref, sums, seen))
            if old is None:
                old = old_seen
        stats = self._statistics(shard, sums, grad_norms, old_seen)
        stats["lr"] = sum(lrs) / len(lrs)
        if ref is None:
            del stats["kl"]  # no KL term this step: absent, not 0.0
        return stats

    def _scores(self, shard: dict[str, torch.Tensor], minis: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """No-grad reference logprobs, and old-policy logprobs when they cannot come from the first epoch."""
        forward_rows = self.recipe.trainer.micro_forward_batch_size_per_gpu
        temperature = self.recipe.generator.sampling_params.temperature
        self.model.eval()
        # Reference logprobs come with the shard when the reference has GPUs of its own (trainer/workers/reference.py).
        ref = shard.get("ref_logprobs")
        if ref is None and self.ref is not None:
            ref = score(self.ref, shard, temperature, forward_rows)
        # With one optimizer step per epoch, the first epoch's forwards all run before any update, so they
        # *are* the old policy's logprobs: reuse them instead of a separate no-grad pass.
        old = score(self.model, shard, temperature, forward_rows) if minis > 1 else None
        return ref, old

    def _optimizer_step(
        self,
        shard: dict[str, torch.Tensor],
        rows: range,
        micro: int,
        old: torch.Tensor | None,
        ref: torch.Tensor | None,
        sums: dict[str, torch.Tensor],
        old_seen: torch.Tensor | None,
    ) -> float:
        """Accumulate the mini-batch `rows` in micro-batches, clip, step; returns the gradient norm."""
        self.optimizer.zero_grad(set_to_none=True)
        starts = range(rows.start, rows.stop, micro)
        for start in starts:
            part = slice(start, min(start + micro, rows.stop))
            batch, width = _take(shard, part)
            # FSDP2 reduce-scatters every micro-batch: waiting for the last would keep whole gradients on each rank.
            loss, old_part = self._micro_loss(
                batch,
                None if old is None else old[part, :width],
                None if ref is None else ref[part, :width],
                sums,
            )
            # Ranks' gradients are averaged, but the weights already normalise over the whole mini-batch: scale
            # by the world size so the average is the sum.
            (loss * self.world_size).backward()
            if old_seen is not None:
                old_seen[part, :width] = old_part
        max_norm = self.recipe.trainer.policy.optimizer_config.max_grad_norm
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        self.optimizer.step()
        self.scheduler.step()
        return float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)

    def _statistics(
        self, shard: dict[str, torch.Tensor], sums: dict[str, torch.Tensor], grad_norms: list[float], old: torch.Tensor
    ) -> dict[str, float]:
        """The step's metrics, summed over every rank's tokens."""
        mask = shard["completion_mask"]
        epochs = self.recipe.trainer.update_epochs_per_batch
        diff = (old - shard["rollout_logprobs"]) * mask
        sums["tokens"] = mask.sum()
        sums["log_ratio_rollout"] = diff.sum()
        sums["abs_log_ratio_rollout"] = diff.abs().sum()
        packed = torch.stack([sums[k] for k in _ALL_SUMS])
        dist.all_reduce(packed)
        totals = dict(zip(_ALL_SUMS, packed.tolist(), strict=True))
        tokens = max(totals["tokens"], 1.0)
        return {
            "pg_loss": totals["pg_loss"] / len(grad_norms),
            "kl": totals["kl_tokens"] / (tokens * epochs),
            "entropy": totals["entropy_tokens"] / (tokens * epochs),
            "clip_frac": totals["clipped_tokens"] / (tokens * epochs),
            "log_ratio_rollout": totals["log_ratio_rollout"] / tokens,
            "abs_log_ratio_rollout": totals["abs_log_ratio_rollout"] / tokens,
            "grad_norm": sum(grad_norms) / len(grad_norms),
            "train_tokens": totals["tokens"] * epochs,
        }

    def _micro_loss(
        self,
        batch: dict[str, torch.Tensor],
        old: torch.Tensor | None,
        ref: torch.Tensor | None,
        sums: dict[str, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch's share of the mini-batch loss, and the old logprobs it used (its own, if None)."""
        algorithm = self.recipe.trainer.algorithm
        logp, entropy = forward_logprobs(self.model, batch, self.recipe.generator.sampling_params.temperature, True)
        assert entropy is not None
        old = logp.detach() if old is None else old
        tis = None
        if algorithm.use_tis:
            tis = grpo.tis_weights(old, batch["rollout_logprobs"], algorithm.tis_imp_ratio_cap)
        mask, weights, seq_weights = batch["completion_mask"], batch["loss_weights"], batch["seq_weights"]
        advantages = batch["advantages"][:, None].expand_as(logp)
        per_token, clipped = grpo.policy_loss(
            logp,
            old,
            advantages,
            eps_clip_low=algorithm.eps_clip_low,
            eps_clip_high=algorithm.eps_clip_high,
            loss_type=algorithm.policy_loss_type,
            clip_ratio_c=algorithm.clip_ratio_c,
            tis_weights=tis,
        )
        pg_loss = (per_token * weights).sum()
        loss = pg_loss
        sums["pg_loss"] += pg_loss.detach()
        if ref is not None:
            kl = grpo.kl_k3(logp, ref)
            # KL stays a per-sequence token mean averaged over the mini-batch (seq_weights), as SkyRL keeps it.
            loss = loss + algorithm.kl_loss_coef * (kl * seq_weights).sum()
            sums["kl_tokens"] += (kl.detach() * mask).sum()
        if algorithm.use_entropy_loss:
            # The bonus is the mini-batch's token-mean entropy, as TRL and SkyRL take it (without their micro bias).
            loss = loss - algorithm.entropy_loss_coef * (entropy * batch["token_weights"]).sum()
        sums["entropy_tokens"] += (entropy.detach() * mask).sum()
        sums["clipped_tokens"] += (clipped * mask).sum()
        return loss, old

    def sequence_logprobs(self, token_ids: list[int], start: int) -> list[float]:
        """Temperature-1 logprobs of token_ids[start:], for the weight-sync check. Every rank must call this."""
        ids = torch.tensor([token_ids], device=self.device)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "completion_mask": ids[:, start:]}
        self.model.eval()
        with torch.no_grad():
            logp, _ = forward_logprobs(self.model, batch, 1.0, False)
        return logp[0].cpu().tolist()


_SUMMED = ("pg_loss", "kl_tokens", "entropy_tokens", "clipped_tokens")
_ALL_SUMS = (*_SUMMED, "tokens", "log_ratio_rollout", "abs_log_ratio_rollout")


_PER_COMPLETION_TOKEN = (
    "completion_mask",
    "rollout_logprobs",
    "ref_logprobs",
    "loss_weights",
    "seq_weights",
    "token_weights",
)


def _take(batch: dict[str, torch.Tensor], rows: slice) -> tuple[dict[str, torch.Tensor], int]:
    """Rows of a batch without the padding columns that none of them uses; returns them and their completion width.

    The batch is padded to its longest prompt and completion; a micro-batch (often one GRPO group) is narrower.
    Logprobs do not change: positions come from the attention mask, and dropped columns are masked everywhere.
    """
    part = {k: v[rows] for k, v in batch.items()}
    completion_width = part["completion_mask"].shape[1]
    prompt_width = part["input_ids"].shape[1] - completion_width
    used = part["attention_mask"].any(dim=0).nonzero()
    left = int(used.min()) if len(used) else 0
    columns = part["completion_mask"].any(dim=0).nonzero()
    kept = int(columns.max()) + 1 if len(columns) else 1  # an all-padding micro-batch keeps one column
    if left == 0 and kept == completion_width:
        return part, completion_width
    for key in ("input_ids", "attention_mask"):
        part[key] = part[key][:, left : prompt_width + kept]
    for key in _PER_COMPLETION_TOKEN:
        if key in part:
            part[key] = part[key][:, :kept]
    return part, kept
