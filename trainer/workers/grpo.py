"""GRPO math, pure functions on tensors (no models, no distribution): what the unit tests pin.

Shapes: B sequences, T completion positions. `mask` is 1.0 on completion tokens (up to and including the
first <eos>) and 0.0 on padding. Reductions follow SkyRL HEAD (#1296): the per-token loss is a plain masked
*sum* with per-token weights that fold the normalisation of the whole optimizer mini-batch in, so the result
does not depend on how the mini-batch is split into micro-batches or data-parallel ranks.
"""

from __future__ import annotations

import torch

LOG_RATIO_CLAMP = 20.0
KL_CLAMP = 10.0
REDUCTIONS = ("token_mean", "seq_mean_token_sum", "seq_mean_token_mean")
POLICY_LOSSES = ("regular", "dual_clip")


def uniform_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[groups] True where every reward of a group of two or more samples is exactly equal: no learning signal.

    An exact comparison, not `std == 0`: the float32 mean of eight rewards of 0.3 is off by ~3e-8, so their std
    is not exactly 0 either. The advantages, the zero-variance filter and the zero-variance metric all use this.
    A singleton group is never uniform: it has no peers, and takes the SkyRL baseline (mean 0, std 1).
    """
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of group_size={group_size}")
    groups = rewards.view(-1, group_size)
    if group_size == 1:
        return torch.zeros(groups.shape[0], dtype=torch.bool, device=rewards.device)
    return (groups == groups[:, :1]).all(dim=1)


def group_advantages(
    rewards: torch.Tensor, group_size: int, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Per-sequence advantages: (r - mean_group) / (std_group + eps), std unbiased (N-1).

    `rewards` is [B] with B = prompts * group_size, each group a contiguous block of one prompt's samples.
    A group whose rewards are all equal gets advantage exactly 0, whatever the values (`uniform_groups`). A
    singleton group uses mean 0 and std 1, as SkyRL does. With `norm_by_std=False` this is Dr. GRPO: r - mean.
    """
    uniform = uniform_groups(rewards, group_size)
    groups = rewards.float().view(-1, group_size)
    if group_size == 1:
        mean, std = torch.zeros_like(groups), torch.ones_like(groups)
    else:
        mean = groups.mean(dim=1, keepdim=True)
        std = groups.std(dim=1, keepdim=True)
    centred = groups - mean
    advantages = centred / (std + eps) if norm_by_std else centred
    return advantages.masked_fill(uniform[:, None], 0.0).reshape(-1)


def reduction_weights(mask: torch.Tensor, reduction: str) -> torch.Tensor:
    """Per-token weights w so that sum(loss * w) is the `reduction` of the loss over the whole mini-batch.

    Call with the mask of the *whole* optimizer mini-batch (all micro-batches, all ranks), then slice.
    B counts the sequences with at least one completion token (all-zero rows are padding).
    - token_mean: every token of the mini-batch counts once: w = mask / sum(mask).
    - seq_mean_token_sum: token sums per sequence, averaged over sequences: w = mask / B.
    - seq_mean_token_mean: token means per sequence, averaged over sequences: w = mask / (B * len_i).
    """
    mask = mask.float()
    n = max(int((mask.sum(dim=1) > 0).sum()), 1)
    if reduction == "token_mean":
        return mask / mask.sum().clamp(min=1.0)
    if reduction == "seq_mean_token_sum":
        return mask / n
    if reduction == "seq_mean_token_mean":
        return mask / (n * mask.sum(dim=1, keepdim=True).clamp(min=1.0))
    raise ValueError(f"loss_reduction={reduction!r} is not supported; use one of {', '.join(REDUCTIONS)}")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    *,
    eps_clip_low: float,
    eps_clip_high: float,
    loss_type: str = "regular",
    clip_ratio_c: float = 3.0,
    tis_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token clipped surrogate loss [B, T] and a per-token 'was clipped' indicator [B, T].

    loss = -min(ratio * A, clamp(ratio, 1 - eps_low, 1 + eps_high) * A), ratio = exp(logp - old_logp).
    dual_clip additionally bounds the loss of negative advantages by -A * clip_ratio_c.
    `tis_weights` (truncated importance sampling, rollout -> trainer) multiply the per-token loss.
    """
    if loss_type not in POLICY_LOSSES:
        raise ValueError(f"policy_loss_type={loss_type!r} is not supported; use one of {', '.join(POLICY_LOSSES)}")
    ratio = torch.exp(torch.clamp(logp - old_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    unclipped = -ratio * advantages
    clipped = -torch.clamp(ratio, 1.0 - eps_clip_low, 1.0 + eps_clip_high) * advantages
    loss = torch.maximum(unclipped, clipped)
    was_clipped = (clipped > unclipped).float()
    if loss_type == "dual_clip":
        bound = -advantages * clip_ratio_c
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    if tis_weights is not None:
        loss = loss * tis_weights
    return loss, was_clipped


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy || ref): exp(ref - logp) - (ref - logp) - 1, clamped like SkyRL."""
    diff = torch.clamp(ref_logp - logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(diff) - diff - 1.0, -KL_CLAMP, KL_CLAMP)


def tis_weights(old_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float) -> torch.Tensor:
    """Truncated importance weights min(exp(old_logp - rollout_logp), cap): trainer vs rollout engine."""
    if cap <= 0:
        raise ValueError(f"tis_imp_ratio_cap={cap} must be > 0 when use_tis is true (e.g. 2.0)")
    return torch.clamp(torch.exp(torch.clamp(old_logp - rollout_logp, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)), max=cap)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of softmax(logits) over the vocabulary: [..., V] -> [...]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """log p(target) under softmax(logits / temperature); temperature 0 (greedy) means 1."""
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(scaled, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def logprobs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """token_logprobs and the entropy of softmax(logits / temperature), sharing one log-softmax."""
    scaled = logits.float() / (temperature if temperature > 0 else 1.0)
    logp = torch.log_softmax(scaled, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(dim=-1)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1.0))
