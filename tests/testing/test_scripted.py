from __future__ import annotations

import pytest
from transformers import ByT5Tokenizer

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.testing.scripted import (
    DEFAULT_LOGPROB,
    ScriptedPolicy,
    ScriptedTurn,
    random_script,
)
from memrl.types import FinishReason

TOK = ByT5Tokenizer()


def ids(text):
    return tuple(TOK.encode(text, add_special_tokens=False))


def test_stop_string_cuts_right_after_it_and_is_kept():
    pol = ScriptedPolicy(TOK, lambda ctx: "abc <python>x=1</python> tail")
    [[out]] = pol.generate([GenerationRequest(ids("p"), SamplingParams(stop=("</python>",)))])
    assert TOK.decode(out.token_ids) == "abc <python>x=1</python>"
    assert out.finish_reason is FinishReason.STOP and out.stop_reason == "</python>"
    assert out.logprobs == (DEFAULT_LOGPROB,) * len(out.token_ids)


def test_eos_finishes_and_length_continues_the_plan():
    pol = ScriptedPolicy(TOK, lambda ctx: "0123456789")
    [[a]] = pol.generate([GenerationRequest(ids("p"), SamplingParams(max_tokens=4))])
    assert a.finish_reason is FinishReason.LENGTH and TOK.decode(a.token_ids) == "0123"
    [[b]] = pol.generate([GenerationRequest(ids("p") + a.token_ids, SamplingParams(max_tokens=50))])
    assert TOK.decode(b.token_ids) == "456789</s>" and b.finish_reason is FinishReason.STOP
    assert b.cached_tokens == len(ids("p")) + 3  # its own earlier output, all but the last token
    assert pol.stats.prefill_tokens == len(ids("p")) + 1 and pol.stats.decode_tokens == 11


def test_prefix_caching_serves_the_longest_remembered_prefix():
    pol = ScriptedPolicy(TOK, lambda ctx: "xy")
    [[a]] = pol.generate([GenerationRequest(ids("abc"), SamplingParams())])
    assert a.cached_tokens == 0
    [[z]] = pol.generate([GenerationRequest(ids("zzzzzzzz"), SamplingParams())])
    assert z.cached_tokens == 0  # nothing in common
    # A request forking inside an earlier output ("abc" + "xy" -> "abcx" + "q") reuses it up to the fork.
    [[c]] = pol.generate([GenerationRequest(ids("abcxq"), SamplingParams())])
    assert c.cached_tokens == len(ids("abcx"))


def test_n_samples_and_top_logprobs():
    pol = ScriptedPolicy(TOK, random_script(min_tokens=5, max_tokens=9), continue_plans=False)
    [outs] = pol.generate([GenerationRequest(ids("p"), SamplingParams(n=4, seed=3, top_logprobs=5))])
    assert len(outs) == 4 and len({o.token_ids for o in outs}) == 4
    assert all(len(o.top_logprobs) == len(o.token_ids) and len(o.top_logprobs[0]) == 5 for o in outs)
    assert pol.stats.prefill_tokens == len(ids("p"))  # the shared prompt counted once


def test_turn_validation():
    pol = ScriptedPolicy(TOK, lambda ctx: ScriptedTurn(text="ab", logprobs=(-1.0,)))
    with pytest.raises(ValueError, match="logprobs"):
        pol.generate([GenerationRequest(ids("p"))])


def test_backend_factory_by_name_and_dotted_path():
    from memrl.policy import make_policy
    from memrl.policy.config import PolicyConfig

    for backend in ("scripted", "memrl.testing.scripted:scripted_backend"):
        pol = make_policy(PolicyConfig(backend=backend, model="memrl.testing.scripted:DEMO_SCRIPT"))
        [[out]] = pol.generate([GenerationRequest(ids("p"), SamplingParams(max_tokens=99))])
        assert pol.tokenizer.decode(out.token_ids) == "<answer>42</answer></s>"
    with pytest.raises(ValueError, match="package.module:script"):
        make_policy(PolicyConfig(backend="scripted", model="nonsense"))
