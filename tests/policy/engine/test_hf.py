"""The HF backend's decode engine against the model's own forward pass (random-init tiny Llama: real forward passes,
seconds)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from memrl.policy import BACKENDS, make_policy
from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.hf import RAGGED_MIN_TOKENS, HFPolicy
from memrl.registry import RegistryError
from memrl.testing import random_tiny_llama
from memrl.types import FinishReason
from tests.policy.engine.hf_fixtures import PROMPTS, enc, forward_logsoftmax, greedy, manual_greedy, peaked


@pytest.fixture(scope="module")
def peaked_policy():
    return peaked()


def test_greedy_equals_manual_argmax_loop(peaked_policy):
    prompts = [enc(peaked_policy, p) for p in PROMPTS]
    outs = peaked_policy.generate([GenerationRequest(p, greedy(12)) for p in prompts])
    for prompt, [out] in zip(prompts, outs, strict=True):
        assert list(out.token_ids) == manual_greedy(peaked_policy.model, prompt, 12)
        assert out.finish_reason is FinishReason.LENGTH and out.prompt_token_ids == prompt
    assert len({o[0].token_ids for o in outs}) > 1  # the check is not vacuous


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_and_top_logprobs_match_forward(peaked_policy, temperature):
    prompt = enc(peaked_policy, PROMPTS[0])
    params = SamplingParams(temperature=temperature, max_tokens=10, top_logprobs=4, seed=7)
    [[out]] = peaked_policy.generate([GenerationRequest(prompt, params)])
    ref = forward_logsoftmax(peaked_policy.model, prompt, out.token_ids, temperature)
    picked = ref[torch.arange(len(out.token_ids)), torch.tensor(out.token_ids)]
    assert torch.allclose(torch.tensor(out.logprobs), picked, atol=1e-4)
    for j, top in enumerate(out.top_logprobs):
        vals, ids = ref[j].topk(4)
        assert list(top) == ids.tolist()
        assert torch.allclose(torch.tensor(list(top.values())), vals, atol=1e-4)


def test_left_padding_does_not_change_results(peaked_policy):
    short = enc(peaked_policy, "Q?")
    long = enc(peaked_policy, "a much longer prompt that forces left padding of the short one " * 3)
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=11, top_logprobs=3)
    [[alone]] = peaked_policy.generate([GenerationRequest(short, params)])
    batched = peaked_policy.generate([GenerationRequest(long, params), GenerationRequest(short, params)])
    together = batched[1][0]
    assert together.token_ids == alone.token_ids
    assert torch.allclose(torch.tensor(together.logprobs), torch.tensor(alone.logprobs), atol=1e-4)


def test_ragged_prefill_equals_one_padded_batch(peaked_policy):
    """Prompts of different lengths, some continuing from cached states (distinct prefixes), n > 1:
    per-prompt prefill then batched decode (CPU) gives the tokens and logprobs of one left-padded prefill (what an
    accelerator runs)."""
    model, tok = peaked_policy.model, peaked_policy.tokenizer
    ragged = HFPolicy.from_model(model, tok, PolicyConfig(model="x", seed=0))
    batched = HFPolicy.from_model(model, tok, PolicyConfig(model="x", seed=0))
    assert ragged.ragged_prefill  # CPU
    ragged.ragged_min_tokens = 2  # every unequal batch one by one, however short its tails
    batched.ragged_prefill = False
    fed = []
    hook = model.register_forward_pre_hook(
        lambda _m, args, kw: fed.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    results = []
    try:
        for policy in (ragged, batched):
            base = enc(policy, PROMPTS[0] * 2)
            [[kept]] = policy.generate([GenerationRequest(base, greedy(6))])
            params = SamplingParams(temperature=1.0, max_tokens=10, seed=5, top_logprobs=3)
            reqs = [GenerationRequest(enc(policy, p), params) for p in (PROMPTS[1], PROMPTS[2] * 2)] + [
                GenerationRequest(base + kept.token_ids + enc(policy, " <result>7</result>"), params),
                GenerationRequest(enc(policy, PROMPTS[0]), dataclasses.replace(params, n=3)),
            ]
            fed.clear()
            results.append([o for outs in policy.generate(reqs) for o in outs])
            if policy is ragged:  # each distinct prompt alone, unpadded; then one batch of all 6 rows
                assert (1, len(reqs[1].prompt_ids)) in fed and (6, 1) in fed
    finally:
        hook.remove()
    for a, b in zip(*results, strict=True):
        assert a.token_ids == b.token_ids and a.cached_tokens == b.cached_tokens
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    assert results[0][2].cached_tokens > 0  # the cached state was reused on both paths
    assert len({o.token_ids for o in results[0]}) > 3


def test_cpu_prefill_pads_short_tails_and_prefills_long_ones_alone(peaked_policy):
    """On CPU, rows computing fewer than ``ragged_min_tokens`` positions (tool results after a kept state) share
    one padded forward; longer, unequal prompts are prefilled one by one."""
    model, tok = peaked_policy.model, peaked_policy.tokenizer
    auto = HFPolicy.from_model(model, tok, PolicyConfig(model="x", seed=0))
    assert auto.ragged_prefill and auto.ragged_min_tokens == RAGGED_MIN_TOKENS  # CPU
    auto.ragged_min_tokens = 16  # the tiny model's prompts are short: the same rule at a smaller threshold
    fed = []
    hook = model.register_forward_pre_hook(
        lambda _m, args, kw: fed.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    try:
        short = [enc(auto, "Q: a?"), enc(auto, "Q: abcdefg?")]  # 5 and 11 tokens: under 16
        auto.generate([GenerationRequest(p, greedy(2)) for p in short])
        assert fed[0] == (2, 11)  # one left-padded batch
        fed.clear()
        auto.invalidate_cache()  # else the short prompts' cached "Q: " would be reused
        long = [enc(auto, "Q: " + "x" * 20), enc(auto, "Q: " + "y" * 30)]
        assert min(len(p) for p in long) >= 16 and len({len(p) for p in long}) == 2
        auto.generate([GenerationRequest(p, greedy(2)) for p in long])
        assert sorted(fed[:2]) == sorted((1, len(p)) for p in long)  # each alone, unpadded
    finally:
        hook.remove()


def test_stop_strings_end_exactly_at_first_occurrence(peaked_policy):
    tok = peaked_policy.tokenizer
    prompt = enc(peaked_policy, PROMPTS[2])
    free = SamplingParams(temperature=1.0, max_tokens=80, seed=5)
    [[ref]] = peaked_policy.generate([GenerationRequest(prompt, free)])
    ascii_ids = range(3 + 33, 3 + 127)  # ByT5: byte b is id b + 3; printable, non-space ASCII
    ids = ref.token_ids
    j = next(j for j in range(10, len(ids) - 1) if ids[j] in ascii_ids and ids[j + 1] in ascii_ids)
    stop = tok.decode(ids[j : j + 2])  # a string the model really writes
    text = tok.decode(ids)
    first_end = text.find(stop) + len(stop)
    params = SamplingParams(temperature=1.0, max_tokens=80, seed=5, stop=("never-there", stop))
    [[out]] = peaked_policy.generate([GenerationRequest(prompt, params)])
    got = tok.decode(out.token_ids)
    assert got == text[:first_end] and got.endswith(stop) and stop not in got[:-1]
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == stop


def test_stop_token_ids_and_eos(peaked_policy):
    prompt = enc(peaked_policy, PROMPTS[0])
    [[ref]] = peaked_policy.generate([GenerationRequest(prompt, greedy(20))])
    target = ref.token_ids[5]
    [[out]] = peaked_policy.generate([GenerationRequest(prompt, greedy(20, stop_token_ids=(target,)))])
    assert out.token_ids == ref.token_ids[: ref.token_ids.index(target) + 1]
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == target


def _cold(policy) -> HFPolicy:
    """The same model behind a backend that caches nothing."""
    return HFPolicy.from_model(
        policy.model, policy.tokenizer, dataclasses.replace(policy.cfg, prefix_cache_tokens=0)
    )


def test_prefix_reuse_equals_full_recompute(peaked_policy):
    """A continuation and a fork inside the first output find their prefix in the radix cache: fewer positions
    computed, the same tokens and log-probs as a backend without a cache."""
    policy = peaked_policy
    policy.invalidate_cache()
    prompt = enc(policy, PROMPTS[0] * 4)
    [[first]] = policy.generate([GenerationRequest(prompt, greedy(10))])
    tool_result = enc(policy, " <result>42</result>")
    cont = prompt + first.token_ids + tool_result
    branch = prompt + first.token_ids[:4]  # branch mid-sequence: the cached state is cropped
    reqs = [GenerationRequest(p, greedy(10, top_logprobs=2)) for p in (cont, branch)]
    policy.forward_stats.clear()
    reused = policy.generate(reqs)
    warm_tokens = policy.forward_stats["tokens"]
    cold = _cold(policy)
    fresh = cold.generate(reqs)
    assert [o[0].cached_tokens for o in reused] == [len(prompt) + 9, len(prompt) + 3]  # >= 1 token computed
    assert [o[0].cached_tokens for o in fresh] == [0, 0]
    assert warm_tokens < cold.forward_stats["tokens"] - len(prompt)  # the prompt, not computed twice
    for [a], [b] in zip(reused, fresh, strict=True):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    policy.invalidate_cache()
    [[after]] = policy.generate([GenerationRequest(cont, greedy(10))])
    assert after.cached_tokens == 0 and after.token_ids == fresh[0][0].token_ids


def test_chained_continuations_reuse_their_own_output(peaked_policy):
    policy = peaked_policy
    policy.invalidate_cache()
    prompt = enc(policy, "chain")
    [[a]] = policy.generate([GenerationRequest(prompt, greedy(5))])
    p2 = prompt + a.token_ids
    [[b]] = policy.generate([GenerationRequest(p2, greedy(5))])
    assert b.cached_tokens == len(p2) - 1
    p3 = p2 + b.token_ids
    [[c]] = policy.generate([GenerationRequest(p3, greedy(5))])
    [[c_ref]] = _cold(policy).generate([GenerationRequest(p3, greedy(5))])
    assert c.cached_tokens == len(p3) - 1 and c.token_ids == c_ref.token_ids
    assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(c_ref.logprobs), atol=1e-4)


def test_n_samples_seeded_and_batch_invariant(peaked_policy):
    prompt = enc(peaked_policy, PROMPTS[1])
    params = SamplingParams(temperature=1.0, max_tokens=12, n=3, seed=21)
    [outs] = peaked_policy.generate([GenerationRequest(prompt, params)])
    assert len(outs) == 3 and len({o.token_ids for o in outs}) > 1
    other = GenerationRequest(enc(peaked_policy, "padding partner " * 5), params)
    again = peaked_policy.generate([other, GenerationRequest(prompt, params)])[1]
    assert [o.token_ids for o in again] == [o.token_ids for o in outs]


def test_n_samples_share_one_prompt_prefill(peaked_policy):
    prompt = enc(peaked_policy, PROMPTS[2] * 3)
    peaked_policy.invalidate_cache()
    fed = []
    hook = peaked_policy.model.register_forward_pre_hook(
        lambda _m, args, kw: fed.append(int(kw["input_ids"].numel())), with_kwargs=True
    )
    try:
        outs = peaked_policy.generate([GenerationRequest(prompt, greedy(max_tokens=6, n=4))])[0]
    finally:
        hook.remove()
    # One prompt[:-1] prefill (1 row); then the 4 rows feed only the last prompt token, then 5 decode steps.
    assert fed[0] == len(prompt) - 1 and set(fed[1:]) == {4} and len(fed) <= 7
    single = peaked_policy.generate([GenerationRequest(prompt, greedy(max_tokens=6))])[0][0]
    assert all(o.token_ids == single.token_ids for o in outs)  # same greedy tokens as one request alone
    assert all(o.cached_tokens == 0 for o in outs)  # computed in this call: not reported as a cache hit
    # The finished rows' states stay cached: a continuation of a sample computes only its last token.
    assert single.cached_tokens == len(prompt) - 1
    assert peaked_policy.prefix_cache.match_length(prompt + outs[0].token_ids) == len(prompt) + 5


def test_context_overflow_aborts_that_request_only():
    model, tok = random_tiny_llama(seed=0, max_position_embeddings=24)
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="x"))
    ok, too_long = (4, 5, 6), tuple(range(3, 30))
    [[a], [b]] = policy.generate([GenerationRequest(ok, greedy(100)), GenerationRequest(too_long, greedy(4))])
    assert a.finish_reason is FinishReason.LENGTH and len(a.token_ids) == 24 - 3
    assert b.finish_reason is FinishReason.ABORT and b.token_ids == ()


def test_registry_and_chat_template(tiny_hf_policy):
    assert {"hf", "vllm", "openai"} <= set(BACKENDS.names())
    with pytest.raises(RegistryError, match="valid choices: .*hf, openai") as err:
        make_policy(PolicyConfig(backend="nope"))
    assert "vllm" in str(err.value)
    msgs = [{"role": "system", "content": "facts"}, {"role": "user", "content": "Q?"}]
    ids = tiny_hf_policy.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)["input_ids"]
    assert tiny_hf_policy.tokenizer.decode(ids).endswith("<|user|>\nQ?\n<|assistant|>\n")


def test_forward_stats_count_every_model_forward(peaked_policy):
    """One padded prefill then one decode forward per further token, all rows in each (every row runs to the
    length limit, so none leaves the batch early)."""
    policy = HFPolicy.from_model(
        peaked_policy.model, peaked_policy.tokenizer, PolicyConfig(model="random-peaked")
    )
    policy.ragged_prefill = False  # accelerator-style: one padded prefill
    prompts = [enc(policy, p) for p in PROMPTS]
    outs = policy.generate([GenerationRequest(p, greedy(6)) for p in prompts])
    assert all(o.finish_reason is FinishReason.LENGTH for [o] in outs)
    stats = policy.forward_stats
    longest = max(len(p) for p in prompts)
    assert stats["calls"] == 1 + 5
    assert stats["rows"] == 3 * 6
    assert stats["tokens"] == 3 * longest + 3 * 5
    assert stats["seconds"] > 0
