"""Tree and chain rollouts on a real (random-init tiny Llama) HF backend: real forward passes, real KV reuse."""

from __future__ import annotations

import pytest

from memrl.rollout import RolloutConfig, RolloutRequest, TreeConfig, run_rollout


@pytest.fixture
def requests(tiny_hf_policy):
    tok = tiny_hf_policy.tokenizer
    return [
        RolloutRequest(tok.encode(f"Q{i}: who painted a sunrise?\nA:", add_special_tokens=False), f"q{i}")
        for i in range(2)
    ]


def test_tree_on_hf_reuses_prefixes_and_its_logprobs_match_a_full_forward(tiny_hf_policy, requests):
    tree = TreeConfig(
        initial_rollouts=2, expansion_iterations=2, nodes_per_expansion=1, beam_size=3, segment_tokens=6
    )
    cfg = RolloutConfig(strategy="tree", n=6, tree=tree, max_response_tokens=20, top_logprobs=5, seed=1)
    result = run_rollout(requests, tiny_hf_policy, None, cfg)
    m = result.metrics
    assert m["rollout/tree/leaves"] == 12 and m["rollout/tree/duplicates"] == 0
    assert m["rollout/cached_tokens"] > 0 and m["rollout/prefix_hit_rate"] > 0.5
    steps = [s for leaves in result.leaves for s in leaves]
    assert all(set(s.response_mask) == {1} for s in steps)
    # Logprobs were gathered from reused KV caches, cropped to the fork nodes; a from-scratch forward must
    # agree.
    scored = tiny_hf_policy.logprobs([(s.prompt_ids, s.response_ids) for s in steps])
    for s, ref in zip(steps, scored, strict=True):
        assert s.logprobs == pytest.approx(ref, abs=1e-4)
    # Every leaf's states stay cached within the budget (a later request over the same context reuses them).
    cache = tiny_hf_policy.prefix_cache
    assert cache.tokens <= cache.budget_tokens and all(node.locks == 0 for node in cache._nodes())
    assert cache.match_length(steps[0].prompt_ids + steps[0].response_ids) >= len(steps[0].prompt_ids)


@pytest.mark.slow
def test_tree_forwards_fewer_tokens_than_chains(tiny_hf_policy, requests):
    common = dict(n=8, max_response_tokens=32, seed=2)
    tree = TreeConfig(
        initial_rollouts=2, expansion_iterations=2, nodes_per_expansion=3, beam_size=2, segment_tokens=8
    )
    chain = run_rollout(requests, tiny_hf_policy, None, RolloutConfig(strategy="chain", **common)).metrics
    treem = run_rollout(
        requests, tiny_hf_policy, None, RolloutConfig(strategy="tree", tree=tree, **common)
    ).metrics
    assert treem["rollout/leaves"] == chain["rollout/leaves"] == 16
    assert treem["rollout/forwarded_tokens"] < chain["rollout/forwarded_tokens"]
