"""Prefill shared across requests (HFPolicy._share_prompts): requests with a long common prompt prefix compute it
once, and decode exactly what each would alone (random-init tiny Llama: real forward passes, seconds)."""

from __future__ import annotations

import random

import pytest

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine import hf
from memrl.policy.engine.hf import MIN_SHARED_PREFIX, HFPolicy
from memrl.policy.engine.radix_cache import common_prefix_len, shared_prefix_groups
from memrl.testing import random_tiny_llama


@pytest.fixture
def policy(tiny_hf_policy):
    """The shared random tiny model behind a fresh HFPolicy (own forward counters, own radix cache); rows run to
    ``max_tokens`` (no end-of-sequence id) so the counts below are exact."""
    pol = HFPolicy.from_model(
        tiny_hf_policy.model, tiny_hf_policy.tokenizer, PolicyConfig(model="random-tiny")
    )
    pol.eos_ids = []
    return pol


def _ids(policy, text: str) -> tuple[int, ...]:
    return tuple(policy.tokenizer.encode(text, add_special_tokens=False))


# ~330 bytes (= tokens for the byte-level tokenizer): above MIN_SHARED_PREFIX.
CONTEXT = "".join(f"[2023-05-{d:02d}] Ann: I moved flat again, now number {d * 7}.\n" for d in range(1, 8))
QUESTIONS = tuple(f"Q: {w} is it?" for w in ("where", "which", "whose", "whole"))  # equal lengths


def _greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def test_common_prefix_len_across_block_boundaries():
    rng = random.Random(0)
    for _ in range(200):
        a = tuple(rng.randrange(3) for _ in range(rng.randrange(300)))
        b = a[: rng.randrange(len(a) + 1)] + tuple(rng.randrange(3) for _ in range(rng.randrange(80)))
        expected = next(
            (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
        )
        assert common_prefix_len(a, b) == expected


def test_shared_prefix_groups_split_where_neighbours_share_too_little():
    p = tuple(range(10))
    prompts = [p + (1, 2), (9,) * 12, p + (0,), p[:4] + (5,) * 8, p, p + (1, 3)]
    # p, p+(0,), p+(1,2), p+(1,3) share p; p itself keeps one token of its own, so the group shares p[:9].
    assert shared_prefix_groups(prompts, 5) == [(9, [4, 2, 0, 5])]
    # A longer minimum leaves only the closest pair.
    assert shared_prefix_groups(prompts, 11) == [(11, [0, 5])]
    assert shared_prefix_groups(prompts[1:2] + prompts[3:4], 1) == []  # singletons are no groups
    assert shared_prefix_groups([p, p], 1) == [(9, [0, 1])]  # identical prompts: all but the last token


def test_shared_prefill_equals_unshared_and_computes_the_prefix_once(policy):
    prompts = [_ids(policy, CONTEXT + q) for q in QUESTIONS]
    prefix = min(common_prefix_len(prompts[0], p) for p in prompts[1:])
    assert prefix >= MIN_SHARED_PREFIX and len({len(p) for p in prompts}) == 1  # equal tails: no padding
    alone = [policy.generate([GenerationRequest(p, _greedy(8))])[0][0] for p in prompts]
    policy.invalidate_cache()
    policy.forward_stats.clear()
    together = policy.generate([GenerationRequest(p, _greedy(8)) for p in prompts])
    for [out], ref in zip(together, alone, strict=True):
        assert out.token_ids == ref.token_ids
        assert out.logprobs == pytest.approx(ref.logprobs, abs=1e-5)
        assert out.cached_tokens == 0  # computed in this call: not reported as a cache hit
    # The comparison is not vacuous: this near-uniform model greedily repeats one byte, but the questions move
    # its logprobs by far more than the tolerance.
    first = sorted(o.logprobs[0] for [o] in together)
    assert first[-1] - first[0] > 1e-4
    tail = len(prompts[0]) - prefix
    # The prefix once (one row), every request's own tail, then 7 decode steps of 4 rows.
    assert policy.forward_stats["tokens"] == prefix + 4 * tail + 7 * 4
    # The radix cache holds the shared prefix below every request's own states: the same call again computes
    # only each prompt's last token and reports the rest as cached.
    policy.forward_stats.clear()
    again = policy.generate([GenerationRequest(p, _greedy(8)) for p in prompts])
    assert [o.token_ids for [o] in again] == [o.token_ids for [o] in together]
    assert policy.forward_stats["tokens"] == 4 * 1 + 7 * 4
    assert {o.cached_tokens for [o] in again} == {len(prompts[0]) - 1}
    policy.invalidate_cache()  # new weights: cached states are stale
    assert len(policy.prefix_cache) == 0 and policy.prefix_cache.tokens == 0


def test_without_sharing_every_request_prefills_its_whole_prompt(policy, monkeypatch):
    prompts = [_ids(policy, CONTEXT + q) for q in QUESTIONS]
    monkeypatch.setattr(hf, "MIN_SHARED_PREFIX", 10**9)
    policy.generate([GenerationRequest(p, _greedy(1)) for p in prompts])
    assert policy.forward_stats["tokens"] == sum(len(p) for p in prompts)


@pytest.fixture(scope="module")
def peaked_policy():
    """A random tiny Llama with larger weights, so its greedy outputs vary instead of repeating one byte."""
    model, tok = random_tiny_llama(seed=3, initializer_range=0.3)
    pol = HFPolicy.from_model(model, tok, PolicyConfig(model="random-peaked"))
    pol.eos_ids = []
    return pol


def test_groups_unrelated_prompts_and_n_samples_in_one_call(peaked_policy):
    """Two contexts (two groups), a short unrelated prompt and a request for 2 samples inside a group: each
    request decodes what it would alone; the 2-sample request computes its own tail once, not per sample."""
    other = CONTEXT.replace("Ann", "Bob")
    texts = [CONTEXT + QUESTIONS[0], other + QUESTIONS[1], "short one", CONTEXT + QUESTIONS[2], other + "Q?"]
    reqs = [GenerationRequest(_ids(peaked_policy, t), _greedy(6)) for t in texts]
    reqs[3] = GenerationRequest(reqs[3].prompt_ids, _greedy(6, n=2))
    alone = [peaked_policy.generate([r])[0] for r in reqs]
    peaked_policy.invalidate_cache()
    peaked_policy.forward_stats.clear()
    stream = peaked_policy.stream()  # the stream path (generate runs one too)
    try:
        ids = stream.add(reqs)
        done: dict = {}
        while len(done) < len(ids):
            done.update(stream.wait())
    finally:
        stream.close()
    for rid, ref in zip(ids, alone, strict=True):
        assert [o.token_ids for o in done[rid]] == [o.token_ids for o in ref]
        for o, r in zip(done[rid], ref, strict=True):
            assert o.logprobs == pytest.approx(r.logprobs, abs=1e-4)
    assert len({done[rid][0].token_ids for rid in ids}) > 2  # not vacuous: the prompts decode differently
    # Every prompt token is computed once at most (the contexts once each, not once per request).
    assert peaked_policy.forward_stats["tokens"] < sum(len(r.prompt_ids) for r in reqs) - len(CONTEXT)


def test_a_shared_prefix_evicted_by_the_cache_budget_is_computed_again(tiny_hf_policy):
    """Under a budget of about one prompt, an unrelated prompt pushes the shared prefix out: the next call
    computes the prefix once again (one row), not every row its whole prompt."""
    prompts = [_ids(tiny_hf_policy, CONTEXT + q) for q in QUESTIONS]
    prefix = min(common_prefix_len(prompts[0], p) for p in prompts[1:])
    small = HFPolicy.from_model(
        tiny_hf_policy.model,
        tiny_hf_policy.tokenizer,
        PolicyConfig(model="random-tiny", prefix_cache_tokens=len(prompts[0]) + 8),
    )
    small.eos_ids = []
    small.generate([GenerationRequest(p, _greedy(4)) for p in prompts])
    assert (
        small.prefix_cache.match_length(prompts[0][:prefix]) == prefix
    )  # the shared part outlives the rows'
    unrelated = _ids(tiny_hf_policy, "#" * len(prompts[0]))
    small.generate([GenerationRequest(unrelated, _greedy(4))])  # pushes it out of the budget
    assert small.prefix_cache.evictions > 0 and small.prefix_cache.tokens <= len(prompts[0]) + 8
    before = small.prefix_cache.match_length(prompts[0][:prefix])
    assert before == 0
    small.forward_stats.clear()
    small.generate([GenerationRequest(p, _greedy(4)) for p in prompts])
    tail = len(prompts[0]) - prefix
    assert small.forward_stats["tokens"] == (prefix - before) + 4 * tail + 3 * 4
