"""Expansion policies: which tree nodes get new branches (registry ``EXPANSION_POLICIES``).

A policy is ``policy(candidates, k, rng) -> list of k nodes`` (a node may repeat when there are fewer than
``k`` candidates). ``entropy`` follows ARPO/TreeRL: branch where the model was uncertain right after the node (top-k entropy, or
the sampled tokens' surprisal where a backend returns no top-k: :func:`output_entropies`).

``tool_call`` forks at tool calls (TreeRL / ARPO branch there): the tree lays a node right after each call's
opening tag (``<python>``) in the branches it has grown (``TreeNode.at_call``), and forks continue from it, so
siblings share everything up to the call and differ in its program. A policy that wants those nodes says so with
the attribute ``call_nodes = True``; the others never see them, so their trees are as before.
"""

from __future__ import annotations

import heapq
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from memrl.registry import Registry

ExpansionPolicy = Callable[[Sequence[Any], int, random.Random], list[Any]]

EXPANSION_POLICIES: Registry[ExpansionPolicy] = Registry("expansion policy")
# Tokens after a node whose mean entropy is the node's: the next few tokens are where a fork there would differ.
ENTROPY_WINDOW = 8


def normalized_entropy(top_logprobs: Sequence[Mapping[int, float]]) -> float:
    """Mean over positions of the entropy of the renormalised top-k distribution, divided by ``log k``.

    ``top_logprobs[t]`` maps the k most likely token ids at position t to log-probs; the result is in [0, 1]
    (0 = certain, 1 = uniform over the k alternatives). Positions with k < 2 count as 0."""
    if not top_logprobs:
        return 0.0
    return sum(token_entropies(top_logprobs)) / len(top_logprobs)


def token_entropies(tops: Sequence[Mapping[int, float]]) -> list[float]:
    """The normalised entropy of every position (:func:`normalized_entropy` is their mean), vectorised:
    token-level tree search needs it for every sampled token, and one Python pass per token is a visible share of
    a tree rollout's wall time with a small model."""
    out = [0.0] * len(tops)
    by_k: dict[int, list[int]] = {}
    for i, top in enumerate(tops):
        by_k.setdefault(len(top), []).append(i)
    for k, idx in by_k.items():
        if k < 2:
            continue
        lps = np.array([list(tops[i].values()) for i in idx], dtype=np.float64)  # [n, k]
        with np.errstate(divide="ignore", invalid="ignore"):
            probs = np.exp(lps)
            total = probs.sum(axis=1)
            # H = -sum (p/Z) log(p/Z) = log Z - sum(p log p) / Z; a zero-probability term contributes 0.
            plogp = np.where(probs > 0, probs * lps, 0.0).sum(axis=1)
            h = np.where(total > 0, np.log(total) - plogp / total, 0.0)
        for i, v in zip(idx, (np.maximum(h, 0.0) / math.log(k)).tolist(), strict=True):
            out[i] = v
    return out


def surprisal_entropies(logprobs: Sequence[float], vocab_size: int) -> list[float]:
    """Per-position uncertainty from the sampled tokens' own log-probs, for backends that return no top-k
    alternatives (verl's servers, ``top_logprobs=0``): the surprisal ``-logp / log V``, clipped to [0, 1].

    Entropy is the expected surprisal, ``H = E_{x~p}[-log p(x)]``, so the sampled token's surprisal is a
    one-sample estimate of the entropy of the distribution it was drawn from, and ``log V`` (``V`` = vocabulary
    size) is the largest that entropy can be. Noisier than :func:`token_entropies` (a likely token can be drawn
    from a flat distribution) but unbiased, so window means still rank where the model was unsure; values are
    on a different scale from the top-k ones (``log V``, not ``log k``), which is harmless because expansion
    compares nodes of one tree, and one backend gives all of them."""
    scale = math.log(max(vocab_size, 2))
    return [min(1.0, max(0.0, -lp) / scale) for lp in logprobs]


def output_entropies(
    top_logprobs: Sequence[Mapping[int, float]], logprobs: Sequence[float], vocab_size: int
) -> list[float]:
    """Per-position uncertainty of one generation: :func:`token_entropies` of its top-k alternatives where the
    backend returned them, else :func:`surprisal_entropies` of the sampled tokens."""
    if top_logprobs:
        return token_entropies(top_logprobs)
    return surprisal_entropies(logprobs, vocab_size)


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
    order = lambda x: (-x[0], x[1])  # noqa: E731
    if len(keyed) >= k:  # a partial sort: the same k as sorted()[:k]
        return [node for _, _, node in heapq.nsmallest(k, keyed, key=order)]
    ranked = [node for _, _, node in sorted(keyed, key=order)]
    return _fill(ranked[:k], ranked, k)


@EXPANSION_POLICIES.register("tool_call")
def tool_call_expansion(candidates: Sequence[Any], k: int, rng: random.Random) -> list[Any]:
    """Nodes right after a tool call's opening tag (``at_call``), least expanded first, ties random; a tree with
    no call yet forks at random nodes (:func:`random_expansion`), so it still grows its leaves."""
    calls = [node for node in candidates if getattr(node, "at_call", False)]
    if not calls:
        return random_expansion(candidates, k, rng)
    ranked = sorted(calls, key=lambda n: (n.expansions, rng.random()))  # one random draw per node
    return _fill(ranked[:k], ranked, k)


tool_call_expansion.call_nodes = True  # type: ignore[attr-defined]
