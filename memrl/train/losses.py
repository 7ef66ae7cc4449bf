"""Clipped policy-gradient loss, KL to the reference policy, and loss aggregation.

All token-level inputs are ``[b, L]`` tensors aligned with a micro-batch's ``input_ids`` (see
:mod:`memrl.train.microbatch`); ``mask`` is the float loss mask (response tokens × sample weight).

Aggregation must be consistent under gradient accumulation: a mini-batch is split into micro-batches, and the
mean must be over the whole mini-batch, not per micro-batch. So an aggregation is two functions: per-token
weights inside a micro-batch, and a count that is summed over the mini-batch's micro-batches to normalise::

    loss_mb = sum(token_loss * agg.weights(mask, seq_index)) / sum_over_minibatch(agg.count(mask, seq_index))
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from memrl.registry import Registry


@dataclass(frozen=True)
class LossAggregation:
    """``weights(mask [b, L], seq_index [b, L]) -> [b, L]`` and ``count(mask, seq_index) -> float``."""

    weights: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    count: Callable[[torch.Tensor, torch.Tensor], float]


LOSS_AGGREGATIONS: Registry[LossAggregation] = Registry("loss aggregation")


def _num_seqs(mask: torch.Tensor, seq_index: torch.Tensor) -> float:
    """Sequences with at least one trained token."""
    return float(torch.unique(seq_index[mask > 0]).numel())


def _per_seq_len(mask: torch.Tensor, seq_index: torch.Tensor) -> torch.Tensor:
    """``[b, L]``: the trained-token count of the sequence each position belongs to (≥ 1 to avoid 0-division)."""
    idx = seq_index.clamp(min=0).flatten()
    lens = torch.zeros(int(idx.max()) + 1 if idx.numel() else 1, device=idx.device).index_add_(
        0, idx, mask.flatten().float()
    )
    return lens[idx].view_as(mask).clamp(min=1.0)


LOSS_AGGREGATIONS.register("token-mean")(
    LossAggregation(weights=lambda m, s: m, count=lambda m, s: float(m.sum()))
)  # every trained token counts equally across the mini-batch (DAPO; verl default)
LOSS_AGGREGATIONS.register("seq-mean-token-sum")(
    LossAggregation(weights=lambda m, s: m, count=_num_seqs)
)  # sum over a sequence's tokens, mean over sequences (Dr. GRPO, unbiased in length)
LOSS_AGGREGATIONS.register("seq-mean-token-mean")(
    LossAggregation(weights=lambda m, s: m / _per_seq_len(m, s), count=_num_seqs)
)  # original GRPO: mean per sequence, then mean over sequences


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clip with decoupled bounds (DAPO's clip-higher): per-token loss ``[b, L]``.

    ``loss = max(-A·ρ, -A·clip(ρ, 1-clip_low, 1+clip_high))`` with ``ρ = exp(logp - old_logp)``.
    Returns the token loss and metrics (``clip_frac``: share of trained tokens where the clipped branch is the
    active one; ``approx_kl``: mean of ``old_logp - logp`` over trained tokens).
    """
    log_ratio = (logp - old_logp).clamp(-20.0, 20.0)  # keep exp finite on wildly off-policy tokens
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        denom = mask.sum().clamp(min=1.0)
        metrics = {
            "clip_frac": ((clipped > unclipped).float() * mask).sum() / denom,
            "approx_kl": (-log_ratio * mask).sum() / denom,
            "ratio_max": (ratio * (mask > 0)).max() if mask.any() else torch.tensor(1.0),
        }
    return loss, metrics


def kl_to_reference(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(π‖π_ref) per token ``[b, L]`` (non-negative, low variance; verl's ``low_var_kl``)."""
    diff = (ref_logp - logp).clamp(-20.0, 20.0)
    return (torch.exp(diff) - diff - 1.0).clamp(max=10.0)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` over positions where ``mask > 0`` (0 when there are none)."""
    return (values * (mask > 0)).sum() / (mask > 0).sum().clamp(min=1)
