"""GRPO formulas pinned on hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.workers import grpo


def test_group_advantages_mean_and_unbiased_std() -> None:
    # Group [1, 0, 0, 0]: mean 0.25; squared deviations 0.5625 + 3 * 0.0625 = 0.75; unbiased var 0.25, std 0.5.
    advantages = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, eps=0.0)
    assert advantages.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])


def test_group_advantages_eps_and_groups_are_independent() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
    advantages = grpo.group_advantages(rewards, group_size=4, eps=1e-6)
    # Second group: mean 0.5, unbiased std sqrt(1/3) = 0.57735.
    second = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert advantages.tolist() == pytest.approx(
        [0.75 / 0.500001, *[-0.25 / 0.500001] * 3, second, second, -second, -second]
    )


def test_all_equal_groups_get_zero_advantage() -> None:
    advantages = grpo.group_advantages(torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), group_size=3)
    assert advantages.tolist() == [0.0] * 6


@pytest.mark.parametrize("value", [0.3, 0.1, 0.7, 1 / 3, 0.0, 1.0, -2.5])
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_all_equal_float_groups_get_exactly_zero_advantage(value: float, norm_by_std: bool) -> None:
    # The float32 mean of eight 0.3s is off by ~3e-8; divided by std + 1e-6 that used to become +0.03 each.
    rewards = torch.tensor([value] * 8 + [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    advantages = grpo.group_advantages(rewards, group_size=8, norm_by_std=norm_by_std)
    assert advantages[:8].tolist() == [0.0] * 8
    assert advantages[8] > 0 and (advantages[9:] < 0).all()
    assert grpo.uniform_groups(rewards, 8).tolist() == [True, False]


def test_uniform_groups_is_an_exact_test() -> None:
    nearly = torch.tensor([0.3, 0.3, 0.3, 0.3 + 1e-7])
    assert grpo.uniform_groups(nearly, 4).tolist() == [False]
    assert grpo.group_advantages(nearly, 4, eps=0.0).abs().max() > 0
    assert grpo.uniform_groups(torch.tensor([0.5, 2.0]), 1).tolist() == [False, False]  # singletons never


def test_dr_grpo_does_not_divide_by_std() -> None:
    advantages = grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0]), group_size=4, norm_by_std=False)
    assert advantages.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_singleton_groups_use_mean_zero_std_one() -> None:
    advantages = grpo.group_advantages(torch.tensor([0.5, 2.0]), group_size=1, eps=0.0)
    assert advantages.tolist() == [0.5, 2.0]


def test_group_size_must_divide_rewards() -> None:
    with pytest.raises(ValueError, match="group_size=4"):
        grpo.group_advantages(torch.tensor([1.0, 0.0, 0.0]), group_size=4)


def _loss(ratio: float, advantage: float, **kwargs: float | str) -> tuple[float, float]:
    logp = torch.tensor([[math.log(ratio)]])
    loss, clipped = grpo.policy_loss(
        logp, torch.zeros(1, 1), torch.tensor([[advantage]]), **{"eps_clip_low": 0.2, "eps_clip_high": 0.2, **kwargs}
    )
    return loss.item(), clipped.item()


def test_clipped_surrogate_by_hand() -> None:
    # ratio 1.5, A=+1: -min(1.5, 1.2) = -1.2 (clipped). ratio 0.5, A=+1: -min(0.5, 0.8) = -0.5 (not clipped).
    assert _loss(1.5, 1.0) == pytest.approx((-1.2, 1.0))
    assert _loss(0.5, 1.0) == pytest.approx((-0.5, 0.0))
    # ratio 0.5, A=-1: -min(-0.5, -0.8) = 0.8 (clipped). ratio 1.5, A=-1: -min(-1.5, -1.2) = 1.5.
    assert _loss(0.5, -1.0) == pytest.approx((0.8, 1.0))
    assert _loss(1.5, -1.0) == pytest.approx((1.5, 0.0))


def test_separate_low_and_high_clip() -> None:
    assert _loss(1.5, 1.0, eps_clip_high=0.28)[0] == pytest.approx(-1.28)
    assert _loss(0.5, -1.0, eps_clip_low=0.1)[0] == pytest.approx(0.9)


def test_dual_clip_bounds_negative_advantages() -> None:
    # ratio 5, A=-1: regular loss max(5, 1.2) = 5; dual clip caps it at -A * c = 3.
    assert _loss(5.0, -1.0)[0] == pytest.approx(5.0)
    assert _loss(5.0, -1.0, loss_type="dual_clip", clip_ratio_c=3.0)[0] == pytest.approx(3.0)
    # Positive advantages are untouched by the dual clip.
    assert _loss(1.5, 1.0, loss_type="dual_clip")[0] == pytest.approx(-1.2)


def test_unknown_policy_loss_is_an_error() -> None:
    with pytest.raises(ValueError, match="policy_loss_type='gspo'"):
        _loss(1.0, 1.0, loss_type="gspo")


def test_kl_k3_by_hand() -> None:
    # ref - logp = log 0.5: exp(-0.6931) + 0.6931 - 1 = 0.193147.
    kl = grpo.kl_k3(torch.tensor([0.0, -1.0]), torch.tensor([math.log(0.5), -1.0]))
    assert kl.tolist() == pytest.approx([0.5 + math.log(2) - 1, 0.0])


def test_tis_weights_truncate_at_cap() -> None:
    # exp(0 - log 0.25) = 4 -> capped at 2; exp(log 0.5 - 0) = 0.5 stays.
    weights = grpo.tis_weights(torch.tensor([0.0, math.log(0.5)]), torch.tensor([math.log(0.25), 0.0]), cap=2.0)
    assert weights.tolist() == pytest.approx([2.0, 0.5])
    with pytest.raises(ValueError, match="tis_imp_ratio_cap"):
        grpo.tis_weights(torch.zeros(1), torch.zeros(1), cap=-1.0)


def test_tis_multiplies_the_per_token_loss() -> None:
    loss, _ = grpo.policy_loss(
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        torch.ones(1, 2),
        eps_clip_low=0.2,
        eps_clip_high=0.2,
        tis_weights=torch.tensor([[2.0, 0.5]]),
    )
    assert loss.flatten().tolist() == pytest.approx([-2.0, -0.5])


MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])


def _weights(reduction: str) -> list[float]:
    return grpo.reduction_weights(MASK, reduction).flatten().tolist()


def test_reduction_weights_by_hand() -> None:
    assert _weights("token_mean") == pytest.approx([1 / 3, 1 / 3, 0, 1 / 3, 0, 0])
    assert _weights("seq_mean_token_sum") == pytest.approx([0.5, 0.5, 0, 0.5, 0, 0])
    assert _weights("seq_mean_token_mean") == pytest.approx([0.25, 0.25, 0, 0.5, 0, 0])
    with pytest.raises(ValueError, match="loss_reduction='sequence_mean'"):
        grpo.reduction_weights(MASK, "sequence_mean")


def test_token_mean_has_no_micro_batch_bias() -> None:
    # Per-token losses 1, 2 (sequence 0) and 6 (sequence 1): the token mean is 3.
    loss = torch.tensor([[1.0, 2.0, 0.0], [6.0, 0.0, 0.0]])
    weights = grpo.reduction_weights(MASK, "token_mean")
    micro_sums = [(loss[i : i + 1] * weights[i : i + 1]).sum() for i in range(2)]
    assert float(sum(micro_sums)) == pytest.approx(3.0)
    # The 0.3.1 "mean of micro-batch means" would give (1.5 + 6) / 2 = 3.75: the bias HEAD removed.
    biased = sum(float((loss[i] * MASK[i]).sum() / MASK[i].sum()) for i in range(2)) / 2
    assert biased == pytest.approx(3.75)


def test_token_logprobs_use_temperature() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]])
    assert grpo.token_logprobs(logits, torch.tensor([1]), 1.0).item() == pytest.approx(math.log(0.75))
    # At temperature 2 the logits halve: probabilities 1 : sqrt(3).
    expected = math.log(math.sqrt(3) / (1 + math.sqrt(3)))
    assert grpo.token_logprobs(logits, torch.tensor([1]), 2.0).item() == pytest.approx(expected)


def test_entropy_of_uniform_is_log_vocab() -> None:
    assert grpo.entropy_from_logits(torch.zeros(2, 4)).tolist() == pytest.approx([math.log(4)] * 2)


def test_fused_logprobs_and_entropy_match_the_separate_ones() -> None:
    logits = torch.randn(3, 4, 7, generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, 7, (3, 4), generator=torch.Generator().manual_seed(1))
    logp, entropy = grpo.logprobs_and_entropy(logits, targets, 0.7)
    assert torch.allclose(logp, grpo.token_logprobs(logits, targets, 0.7))
    assert torch.allclose(entropy, grpo.entropy_from_logits(logits / 0.7))
