"""The loss pieces on tensors small enough to work out by hand: PPO clipping, aggregation, KL to reference."""

from __future__ import annotations

import math

import pytest
import torch

from memrl.registry import RegistryError
from memrl.train.losses import LOSS_AGGREGATIONS, clipped_policy_loss, kl_to_reference, masked_mean

CLIP_LOW, CLIP_HIGH = 0.2, 0.28  # the trust region is [0.8, 1.28]


def _clip(ratios: list[float], adv: list[float], mask: list[float] | None = None):
    """``clipped_policy_loss`` on one row with ``old_logp`` = 0, so ``logp`` = log(ratio)."""
    logp = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)
    mask_t = torch.tensor([mask if mask is not None else [1.0] * len(ratios)])
    loss, metrics = clipped_policy_loss(
        logp, torch.zeros_like(logp), torch.tensor([adv]), mask_t, CLIP_LOW, CLIP_HIGH
    )
    loss.sum().backward()
    return loss[0].tolist(), logp.grad[0].tolist(), metrics


def test_positive_advantage_clips_above_only():
    # A = +1. ratio 1.5: -1.5 vs -1.28 -> max is the clipped -1.28, no gradient (the update went far enough).
    # ratio 0.5: -0.5 vs -0.8 -> the unclipped -0.5 (the low bound never stops raising a good token).
    # ratio 1.1: inside the region, -1.1. Gradient of -A·ρ w.r.t. log ρ is -A·ρ.
    loss, grad, _ = _clip([1.5, 0.5, 1.1], [1.0, 1.0, 1.0])
    assert loss == pytest.approx([-1.28, -0.5, -1.1])
    assert grad == pytest.approx([0.0, -0.5, -1.1])


def test_negative_advantage_clips_below_only():
    # A = -1. ratio 0.5: 0.5 vs 0.8 -> the clipped 0.8, no gradient.
    # ratio 1.5: 1.5 vs 1.28 -> the unclipped 1.5 (a bad token whose probability grew is always pushed down).
    # ratio 0.9: inside the region, 0.9.
    loss, grad, _ = _clip([0.5, 1.5, 0.9], [-1.0, -1.0, -1.0])
    assert loss == pytest.approx([0.8, 1.5, 0.9])
    assert grad == pytest.approx([0.0, 1.5, 0.9])


def test_clip_bounds_are_decoupled():
    # ratio 1.25 is inside [0.8, 1.28] but would be clipped under a symmetric 0.2: clip-higher lets it move.
    loss, grad, _ = _clip([1.25], [2.0])
    assert loss == pytest.approx([-2.5]) and grad == pytest.approx([-2.5])
    # ratio 0.75 is below 1 - clip_low = 0.8: with A = -2, loss = max(1.5, 1.6) = 1.6, clipped.
    loss, grad, _ = _clip([0.75], [-2.0])
    assert loss == pytest.approx([1.6]) and grad == pytest.approx([0.0])


def test_clip_metrics_count_trained_tokens_only():
    # Clipped tokens: ratio 1.5 with A > 0 and ratio 0.5 with A < 0; the ratio-3 token is masked out.
    ratios = [1.5, 0.5, 0.5, 1.5, 3.0]
    _, _, m = _clip(ratios, [1.0, 1.0, -1.0, -1.0, 1.0], mask=[1.0, 1.0, 1.0, 1.0, 0.0])
    assert float(m["clip_frac"]) == pytest.approx(2 / 4)
    # approx_kl = mean of (old_logp - logp) over trained tokens = -(2·ln 1.5 + 2·ln 0.5) / 4
    assert float(m["approx_kl"]) == pytest.approx(-(2 * 0.4054651 + 2 * -0.6931472) / 4, abs=1e-6)
    assert float(m["ratio_max"]) == pytest.approx(1.5)


def test_clip_metrics_of_a_row_with_no_trained_token():
    _, _, m = _clip([2.0], [1.0], mask=[0.0])
    assert float(m["clip_frac"]) == 0.0 and float(m["approx_kl"]) == 0.0 and float(m["ratio_max"]) == 1.0


def test_wildly_off_policy_ratio_stays_finite():
    logp = torch.tensor([[50.0, -50.0]])
    loss, m = clipped_policy_loss(
        logp, torch.zeros_like(logp), torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2), CLIP_LOW, CLIP_HIGH
    )
    assert torch.isfinite(loss).all() and torch.isfinite(m["ratio_max"])
    # log-ratio is held at ±20: A = -1 at ratio e^20 gives e^20; A = +1 at ratio e^-20 gives -e^-20.
    assert loss[0].tolist() == pytest.approx([math.exp(20.0), -math.exp(-20.0)])


# Aggregation. Two sequences, one per row, over [prompt, response..., padding]; the loss is 9 wherever nothing
# trains, so any weight on those positions shows. Trained tokens: sequence 0 has 1, 3; sequence 1 has 2, 4, 6.
TOKEN_LOSS = torch.tensor([[9.0, 1.0, 3.0, 9.0], [9.0, 2.0, 4.0, 6.0]])
MASK = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 1.0, 1.0]])
SEQ_INDEX = torch.tensor([[0, 0, 0, -1], [1, 1, 1, 1]])


def _aggregate(name: str, loss: torch.Tensor, mask: torch.Tensor, seq_index: torch.Tensor) -> float:
    agg = LOSS_AGGREGATIONS.get(name)
    return float((loss * agg.weights(mask, seq_index)).sum() / agg.count(mask, seq_index))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("token-mean", (1 + 3 + 2 + 4 + 6) / 5),  # every trained token alike: 16 / 5
        ("seq-mean-token-sum", ((1 + 3) + (2 + 4 + 6)) / 2),  # sum per sequence, mean over sequences: 16 / 2
        ("seq-mean-token-mean", ((1 + 3) / 2 + (2 + 4 + 6) / 3) / 2),  # (2 + 4) / 2
    ],
)
def test_aggregation_modes(name, expected):
    assert _aggregate(name, TOKEN_LOSS, MASK, SEQ_INDEX) == pytest.approx(expected)


def test_aggregations_are_the_registered_ones():
    assert set(LOSS_AGGREGATIONS.names()) == {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean"}
    with pytest.raises(RegistryError):
        LOSS_AGGREGATIONS.get("seq-sum")


@pytest.mark.parametrize("name", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_a_sequence_with_no_trained_token_is_not_counted(name):
    # A third row whose mask is all 0 (a dropped duplicate, a flat group) changes no mean.
    loss = torch.cat([TOKEN_LOSS, torch.full((1, 4), 7.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4)])
    seq_index = torch.cat([SEQ_INDEX, torch.full((1, 4), 2)])
    assert _aggregate(name, loss, mask, seq_index) == pytest.approx(
        _aggregate(name, TOKEN_LOSS, MASK, SEQ_INDEX)
    )


def test_sample_weights_in_the_mask():
    # Sequence 1 at weight 0.5: token-mean = (1 + 3 + 0.5·(2 + 4 + 6)) / (2 + 0.5·3) = 10 / 3.5;
    # seq-mean-token-sum = (1 + 3 + 0.5·(2 + 4 + 6)) / 2 sequences = 10 / 2.
    mask = MASK * torch.tensor([[1.0], [0.5]])
    assert _aggregate("token-mean", TOKEN_LOSS, mask, SEQ_INDEX) == pytest.approx(10 / 3.5)
    assert _aggregate("seq-mean-token-sum", TOKEN_LOSS, mask, SEQ_INDEX) == pytest.approx(10 / 2)
    # seq-mean-token-mean divides a sequence by the sum of its mask (as verl's agg_loss), so a weight shared
    # by all of a sequence's tokens cancels: (0.5·(2 + 4 + 6) / (0.5·3) + (1 + 3) / 2) / 2 = (4 + 2) / 2.
    assert _aggregate("seq-mean-token-mean", TOKEN_LOSS, mask, SEQ_INDEX) == pytest.approx(3.0)


def test_two_sequences_in_one_row():
    # A packed row: sequence 0 = positions 0-2 (trained 1, 3), sequence 1 = positions 3-6 (trained 2, 4, 6).
    loss = torch.tensor([[9.0, 1.0, 3.0, 9.0, 2.0, 4.0, 6.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]])
    seq_index = torch.tensor([[0, 0, 0, 1, 1, 1, 1]])
    assert _aggregate("seq-mean-token-mean", loss, mask, seq_index) == pytest.approx(3.0)
    assert _aggregate("seq-mean-token-sum", loss, mask, seq_index) == pytest.approx(8.0)


@pytest.mark.parametrize("name", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batches_sum_to_the_mini_batch(name):
    # Gradient accumulation: each row alone as a micro-batch, normalised by the count summed over both, adds
    # up to the whole mini-batch's loss (each micro-batch numbers its sequences from 0).
    agg = LOSS_AGGREGATIONS.get(name)
    parts = [
        (TOKEN_LOSS[i : i + 1], MASK[i : i + 1], SEQ_INDEX[i : i + 1] - SEQ_INDEX[i, 0]) for i in range(2)
    ]
    total = sum(agg.count(m, s) for _, m, s in parts)
    accumulated = sum(float((loss * agg.weights(m, s)).sum()) / total for loss, m, s in parts)
    assert accumulated == pytest.approx(_aggregate(name, TOKEN_LOSS, MASK, SEQ_INDEX))


def test_kl_to_reference_k3_values():
    # k3 = exp(d) - d - 1 with d = ref_logp - logp.
    logp = torch.zeros(1, 5)
    ref = torch.tensor([[0.0, math.log(2.0), -math.log(2.0), -5.0, 5.0]])
    kl = kl_to_reference(logp, ref)[0].tolist()
    assert kl[0] == 0.0  # the same policy
    assert kl[1] == pytest.approx(2.0 - 0.6931472 - 1.0, abs=1e-6)  # 0.3068528
    assert kl[2] == pytest.approx(0.5 + 0.6931472 - 1.0, abs=1e-6)  # 0.1931472
    assert kl[3] == pytest.approx(0.0067379 + 5.0 - 1.0, abs=1e-6)  # 4.0067379
    assert kl[4] == 10.0  # e^5 - 6 = 142.4: capped


def test_kl_to_reference_gradient_vanishes_at_the_reference():
    # d k3 / d logp = 1 - exp(d): 0 at d = 0, 1 - 2 = -1 at d = ln 2.
    logp = torch.tensor([[0.0, 0.0]], requires_grad=True)
    kl_to_reference(logp, torch.tensor([[0.0, math.log(2.0)]])).sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, -1.0])


def test_masked_mean():
    values = torch.tensor([[1.0, 2.0, 3.0], [10.0, 20.0, 30.0]])
    assert float(masked_mean(values, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.5, 0.0]]))) == pytest.approx(
        (1 + 3 + 20) / 3
    )  # any positive mask counts once, whatever its weight
    assert float(masked_mean(values, torch.zeros(2, 3))) == 0.0
