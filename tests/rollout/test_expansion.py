from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from memrl.rollout.expansion import (
    EXPANSION_POLICIES,
    normalized_entropy,
    output_entropies,
    surprisal_entropies,
    token_entropies,
)


def test_normalized_entropy_bounds():
    flat = {i: math.log(0.2) for i in range(5)}
    peaked = {0: math.log(0.999), 1: math.log(0.001)}
    assert normalized_entropy([flat]) == pytest.approx(1.0)
    assert normalized_entropy([peaked]) < 0.02
    assert normalized_entropy([flat, {7: 0.0}]) == pytest.approx(0.5)  # k < 2 counts as certain
    assert normalized_entropy([]) == 0.0


def _nodes(entropies):
    return [SimpleNamespace(name=i, entropy=e, expansions=0) for i, e in enumerate(entropies)]


def test_entropy_policy_prefers_uncertain_nodes_and_spreads_out():
    nodes = _nodes([0.1, 0.9, 0.5, 0.8])
    pick = EXPANSION_POLICIES.get("entropy")
    assert [n.name for n in pick(nodes, 2, random.Random(0))] == [1, 3]
    nodes[1].expansions = 3  # already expanded a lot: 0.9 / 4 < 0.5
    assert [n.name for n in pick(nodes, 2, random.Random(0))] == [3, 2]


def test_policies_return_k_nodes_even_from_few_candidates():
    nodes = _nodes([0.3, 0.2])
    for name in ("random", "entropy"):
        got = EXPANSION_POLICIES.get(name)(nodes, 5, random.Random(1))
        assert len(got) == 5 and {n.name for n in got} == {0, 1}
    got = EXPANSION_POLICIES.get("random")(_nodes([0] * 10), 4, random.Random(2))
    assert len({n.name for n in got}) == 4  # without replacement when there are enough


def _entropy_reference(top):
    """The plain per-position definition: entropy of the renormalised top-k distribution / log k."""
    if len(top) < 2:
        return 0.0
    probs = [math.exp(v) for v in top.values()]
    z = sum(probs)
    return -sum((p / z) * math.log(p / z) for p in probs if p > 0) / math.log(len(top))


def test_token_entropies_match_the_definition_per_position():
    rng = random.Random(3)
    tops = []
    for _ in range(200):
        k = rng.choice([1, 2, 3, 5])
        raw = [rng.random() ** 3 for _ in range(k)]
        tops.append({i: math.log(r / sum(raw)) for i, r in enumerate(raw)})
    tops.append({0: 0.0, 1: float("-inf")})  # a zero-probability alternative contributes nothing
    got = token_entropies(tops)
    assert len(got) == len(tops)
    for top, h in zip(tops, got, strict=True):
        assert h == pytest.approx(_entropy_reference(top), abs=1e-9)
    assert got[-1] == 0.0 and token_entropies([]) == []


def test_without_top_k_the_sampled_surprisal_stands_in_for_entropy():
    lps = [0.0, math.log(0.5), math.log(1 / 256), -50.0]
    assert surprisal_entropies(lps, 256) == pytest.approx([0.0, 1 / 8, 1.0, 1.0])  # -logp / log V, clipped
    # its expectation under the distribution is the entropy: uniform over V tokens gives exactly 1
    assert output_entropies((), lps, 256) == surprisal_entropies(lps, 256)
    tops = [{0: math.log(0.5), 1: math.log(0.5)}] * 4
    assert output_entropies(tops, lps, 256) == token_entropies(tops)  # top-k wins where given
