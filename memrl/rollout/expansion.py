"""Expansion policies: which tree nodes get new branches (registry ``EXPANSION_POLICIES``).

A policy is ``policy(candidates, k, rng) -> list of k nodes`` (a node may repeat when there are fewer than
``k`` candidates). ``entropy`` follows ARPO/TreeRL: branch where the model was uncertain right after the node.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from memrl.registry import Registry

ExpansionPolicy = Callable[[Sequence[Any], int, random.Random], list[Any]]

EXPANSION_POLICIES: Registry[ExpansionPolicy] = Registry("expansion policy")


def normalized_entropy(top_logprobs: Sequence[Mapping[int, float]]) -> float:
    """Mean over positions of the entropy of the renormalised top-k distribution, divided by ``log k``.

    ``top_logprobs[t]`` maps the k most likely token ids at position t to log-probs; the result is in [0, 1]
    (0 = certain, 1 = uniform over the k alternatives). Positions with k < 2 count as 0."""
    if not top_logprobs:
        return 0.0
    return sum(map(token_entropy, top_logprobs)) / len(top_logprobs)


def token_entropy(top: Mapping[int, float]) -> float:
    """:func:`normalized_entropy` of one position (tree search calls it for every sampled token)."""
    k = len(top)
    if k < 2:
        return 0.0
    lps = list(top.values())
    probs = [math.exp(lp) for lp in lps]
    total = sum(probs)
    if total <= 0:
        return 0.0
    # H = -sum (p/Z) log(p/Z) = log Z - sum(p log p) / Z: one log instead of k.
    h = math.log(total) - sum(p * lp for p, lp in zip(probs, lps, strict=True) if p > 0) / total
    return max(0.0, h) / math.log(k)


def _fill(chosen: list[Any], ranked: Sequence[Any], k: int) -> list[Any]:
    i = 0
    while len(chosen) < k and ranked:
        chosen.append(ranked[i % len(ranked)])
        i += 1
    return chosen


@EXPANSION_POLICIES.register("random")
def random_expansion(candidates: Sequence[Any], k: int, rng: random.Random) -> list[Any]:
    """Uniform without replacement; with fewer candidates than ``k``, some are picked again."""
    if len(candidates) >= k:
        return rng.sample(list(candidates), k)
    return _fill(list(candidates), rng.sample(list(candidates), len(candidates)), k)


@EXPANSION_POLICIES.register("entropy")
def entropy_expansion(candidates: Sequence[Any], k: int, rng: random.Random) -> list[Any]:
    """The ``k`` nodes with the highest entropy after them, discounted by how often each was already
    expanded (``entropy / (1 + expansions)``) so one uncertain spot does not take every branch; ties random."""
    keyed = [(node.entropy / (1 + node.expansions), rng.random(), node) for node in candidates]
    ranked = [node for _, _, node in sorted(keyed, key=lambda x: (-x[0], x[1]))]
    return _fill(ranked[:k], ranked, k)
