"""Scoring with the HF backend (:mod:`memrl.policy.engine.score`) against the model's own forward pass."""

from __future__ import annotations

import pytest
import torch

from memrl.policy.base import GenerationRequest
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.hf import HFPolicy
from memrl.policy.engine.radix_cache import common_prefix_len
from memrl.testing import random_tiny_llama
from tests.policy.engine.hf_fixtures import PROMPTS, enc, forward_logsoftmax, greedy, peaked


@pytest.fixture(scope="module")
def peaked_policy():
    return peaked()


def test_training_time_logprobs_match_forward(peaked_policy):
    pairs = [(enc(peaked_policy, p), enc(peaked_policy, " answer " * (i + 1))) for i, p in enumerate(PROMPTS)]
    pairs.append((enc(peaked_policy, "x"), ()))
    scores = peaked_policy.logprobs(pairs)
    for (prompt, resp), got in zip(pairs, scores, strict=True):
        assert len(got) == len(resp)
        if resp:
            ref = forward_logsoftmax(peaked_policy.model, prompt, resp)
            want = ref[torch.arange(len(resp)), torch.tensor(resp)]
            assert torch.allclose(torch.tensor(got), want, atol=1e-4)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_scoring_prompts_that_share_a_long_prefix_computes_it_once(temperature):
    """The forks of one memory write build answer prompts that differ from the forked fact on: the second is
    scored from the first's states, with the log-probs of a whole forward."""
    model, tok = random_tiny_llama(seed=3, initializer_range=0.3)
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="random-peaked", seed=0))
    context = enc(policy, "Memory: Ann lives in Rome. Mia is a nurse. Tom bought a red bike. " * 2)
    gold = enc(policy, " Rome")
    pairs = [
        (context + enc(policy, f" {fact} Q: where does Ann live?"), gold) for fact in ("Ann moved.", "NOOP")
    ]
    tokens = policy.forward_stats["check_tokens"]
    scores = policy.logprobs(pairs, temperature=temperature)
    common = common_prefix_len(*(p for p, _ in pairs))
    assert common >= len(context)
    fed = policy.forward_stats["check_tokens"] - tokens  # each prompt and its reply but the last token
    assert fed == sum(len(p) + len(r) - 1 for p, r in pairs) - common  # the second fed from its own tail on
    for (prompt, resp), got in zip(pairs, scores, strict=True):
        ref = forward_logsoftmax(model, prompt, resp, temperature)
        assert torch.allclose(torch.tensor(got), ref[torch.arange(len(resp)), torch.tensor(resp)], atol=1e-4)


def test_greedy_logprobs_says_which_replies_greedy_decoding_writes(peaked_policy):
    prompts = [enc(peaked_policy, p) for p in PROMPTS]
    outs = peaked_policy.generate([GenerationRequest(p, greedy(10)) for p in prompts])
    replies = [o[0].token_ids for o in outs]
    changed = (replies[0][:4] + ((replies[0][4] + 1) % 256,) + replies[0][5:],)
    scored = peaked_policy.greedy_logprobs([*zip(prompts, replies, strict=True), (prompts[0], changed[0])])
    for (lps, argmax, argmax_lps), out in zip(scored[:3], outs, strict=True):
        assert argmax == list(out[0].token_ids)
        assert torch.allclose(torch.tensor(lps), torch.tensor(out[0].logprobs), atol=1e-4)
        assert torch.allclose(torch.tensor(argmax_lps), torch.tensor(lps))  # greedy: the argmax is the token
    lps, argmax, argmax_lps = scored[3]
    # the changed token is not greedy: the argmax there is the decoded one, with its log-prob
    assert argmax[:5] == list(replies[0][:5]) and argmax != list(changed[0])
    assert argmax_lps[4] == pytest.approx(outs[0][0].logprobs[4], abs=1e-4) and lps[4] < argmax_lps[4]


def test_a_draft_check_reads_the_cached_prompt_and_decoding_resumes_where_the_draft_departs():
    """The check computes only what the prefix cache lacks, gives what a check of the whole prompt gives, and
    leaves the states up to the first token the draft gets wrong: decoding on from the greedy token there
    computes one position and writes the greedy reply's tail."""
    model, tok = random_tiny_llama(seed=3, initializer_range=0.3)
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="random-peaked", seed=0))
    uncached = HFPolicy.from_model(model, tok, PolicyConfig(model="random-peaked", prefix_cache_tokens=0))
    shared = enc(policy, "You keep the memory of a conversation. Write one line per new message. " * 2)
    prompts = [shared + enc(policy, p) for p in PROMPTS]
    [[first]] = policy.generate([GenerationRequest(prompts[0], greedy(10))])  # leaves prompts[0] + reply
    outs = uncached.generate([GenerationRequest(p, greedy(10)) for p in prompts])
    replies = [list(o[0].token_ids) for o in outs]
    assert replies[0] == list(first.token_ids)
    bad = replies[2][:3] + [(replies[2][3] + 1) % 256] + replies[2][4:]
    pairs = [(prompts[1], replies[1]), (prompts[2], bad)]
    tokens = policy.forward_stats["check_tokens"]
    got = policy.greedy_logprobs(pairs)
    # the instructions and the whole first prompt were cached: only each prompt's own tail and reply are fed
    assert policy.forward_stats["check_tokens"] - tokens == sum(
        len(p) - len(shared) + len(r) - 1 for p, r in pairs
    )
    want = uncached.greedy_logprobs(pairs)
    for (lps, best, best_lps), (w_lps, w_best, w_best_lps) in zip(got, want, strict=True):
        assert best == w_best
        assert torch.allclose(torch.tensor(lps), torch.tensor(w_lps), atol=1e-4)
        assert torch.allclose(torch.tensor(best_lps), torch.tensor(w_best_lps), atol=1e-4)
    assert got[0][1] == replies[1] and got[1][1][:4] == replies[2][:4]
    head = [*bad[:3], got[1][1][3]]
    assert policy.prefix_cache.match_length(prompts[2] + tuple(bad[:3])) == len(prompts[2]) + 3
    assert policy.prefix_cache.match_length(prompts[1] + tuple(replies[1])) < len(
        prompts[1]
    )  # taken: kept nothing
    tokens = policy.forward_stats["tokens"]
    [[tail]] = policy.generate([GenerationRequest(prompts[2] + tuple(head), greedy(10 - len(head)))])
    assert head + list(tail.token_ids) == replies[2]
    prefill = policy.forward_stats["tokens"] - tokens - (len(tail.token_ids) - 1)  # minus the decode steps
    assert prefill == 1
