"""Outcome advantage estimators: one scalar reward per sequence → one advantage per sequence.

Every estimator has the signature :data:`AdvantageFn`::

    fn(scores: Tensor[B], group_ids: Sequence[str], weights: Tensor[B], eps: float) -> Tensor[B]

``scores[i]`` is sequence i's outcome reward, ``group_ids[i]`` its GRPO group (the ``n`` samples of one prompt;
for tree rollouts every leaf of one tree keeps the prompt's group, so siblings are compared with each other and
with the other trees of the same prompt). ``weights[i]`` is 1 for a counted sample and 0 for one that must not
enter the group statistics — :func:`sample_weights` gives 0 to leaves flagged ``StepMeta.is_duplicate`` (copies
the tree sampler adds when a tree has fewer distinct leaves than ``n``): counting a copy twice would pull the
group baseline towards it and double its gradient, so each distinct leaf counts once. The same weights multiply
the token mask in the loss.

Groups of a single counted sample follow verl: mean 0 and std 1, so the advantage is the raw score.
:func:`token_advantages` broadcasts the result over response tokens (``[B, T]``), as verl's
``compute_*_outcome_advantage`` return it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import torch

from memrl.registry import Registry
from memrl.types import StepMeta

AdvantageFn = Callable[[torch.Tensor, Sequence[str], torch.Tensor, float], torch.Tensor]

ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def _groups(group_ids: Sequence[str], weights: torch.Tensor) -> dict[str, list[int]]:
    """Row indices per group, counted rows only."""
    out: dict[str, list[int]] = defaultdict(list)
    for i, gid in enumerate(group_ids):
        if weights[i] > 0:
            out[gid].append(i)
    return out


def _check(scores: torch.Tensor, group_ids: Sequence[str], weights: torch.Tensor) -> None:
    if scores.dim() != 1:
        raise ValueError(f"advantage: scores must be [B], got shape {tuple(scores.shape)}")
    if len(group_ids) != scores.shape[0] or weights.shape != scores.shape:
        raise ValueError(
            f"advantage: scores [{scores.shape[0]}], group_ids [{len(group_ids)}] and weights "
            f"{list(weights.shape)} must have the same length"
        )


def group_stats(scores: torch.Tensor, group_ids: Sequence[str], weights: torch.Tensor):
    """Per-row group mean, unbiased std and counted size, each ``[B]`` (float64 for exact agreement)."""
    s = scores.double()
    mean = torch.zeros_like(s)
    std = torch.ones_like(s)
    size = torch.ones_like(s)
    members = _groups(group_ids, weights)
    for i, gid in enumerate(group_ids):
        rows = members.get(gid, [])
        if len(rows) > 1:
            g = s[rows]
            mean[i], std[i], size[i] = g.mean(), g.std(), float(len(rows))
    return s, mean, std, size


@ADVANTAGES.register("grpo")
def grpo(
    scores: torch.Tensor, group_ids: Sequence[str], weights: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: ``(r - mean_g) / (std_g + eps)`` with the unbiased group std. ``[B] → [B]``."""
    _check(scores, group_ids, weights)
    s, mean, std, _ = group_stats(scores, group_ids, weights)
    return ((s - mean) / (std + eps)).to(scores.dtype)


@ADVANTAGES.register("drgrpo")
def drgrpo(
    scores: torch.Tensor, group_ids: Sequence[str], weights: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """Dr. GRPO: ``r - mean_g`` (no std division, so low-variance groups are not amplified). ``[B] → [B]``."""
    _check(scores, group_ids, weights)
    s, mean, _, _ = group_stats(scores, group_ids, weights)
    return (s - mean).to(scores.dtype)


@ADVANTAGES.register("rloo")
def rloo(
    scores: torch.Tensor, group_ids: Sequence[str], weights: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """RLOO: ``r_i - mean_{j != i} r_j = n/(n-1) · (r_i - mean_g)`` for groups of n > 1. ``[B] → [B]``."""
    _check(scores, group_ids, weights)
    s, mean, _, size = group_stats(scores, group_ids, weights)
    scale = torch.where(size > 1, size / (size - 1).clamp(min=1), torch.ones_like(size))
    return (scale * (s - mean)).to(scores.dtype)


@ADVANTAGES.register("none")
def no_policy_gradient(
    scores: torch.Tensor, group_ids: Sequence[str], weights: torch.Tensor, eps: float = 1e-6
) -> torch.Tensor:
    """Zero advantages: no policy-gradient term, so only the replay (SFT/RFT) and KL terms train. The ablation
    that tells what the policy gradient adds over imitation (``memrl train ... train.advantage=none``)."""
    _check(scores, group_ids, weights)
    return torch.zeros_like(scores)


def signal_weights(scores: torch.Tensor, group_ids: Sequence[str], weights: torch.Tensor) -> torch.Tensor:
    """``[B]``: 0 for the rows of a group of several counted samples whose scores are all equal, else 1. Their
    advantage is 0 under every estimator, so without a KL or entropy term they carry no gradient: the updater
    skips them as ``dynamic_sampling`` skips such answer groups (most groups of ``local`` memory credit once
    the writer is mostly right)."""
    _, _, std, size = group_stats(scores, group_ids, weights)
    return torch.where((size > 1) & (std == 0), 0.0, 1.0).to(torch.float32)


def sample_weights(step_meta: Sequence[StepMeta]) -> torch.Tensor:
    """``[B]`` float weights: 0 for leaves flagged ``is_duplicate``, else 1."""
    return torch.tensor([0.0 if m.is_duplicate else 1.0 for m in step_meta])


def token_advantages(seq_adv: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast ``[B]`` sequence advantages over ``[B, T]`` response tokens (0 where the mask is 0)."""
    return seq_adv.unsqueeze(-1).to(
        response_mask.dtype if response_mask.is_floating_point() else torch.float32
    ) * (response_mask)


def compute_advantages(
    name: str,
    scores: torch.Tensor,
    group_ids: Sequence[str],
    weights: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Look up ``name`` in :data:`ADVANTAGES` and apply it. ``weights`` defaults to all ones. ``[B] → [B]``."""
    if weights is None:
        weights = torch.ones_like(scores, dtype=torch.float32)
    return ADVANTAGES.get(name)(scores, group_ids, weights, eps)
