"""Prompt-lookup speculative decoding (memrl.policy.engine.speculative): the same outputs as plain decoding, fewer steps."""

from __future__ import annotations

import pytest
import torch

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine import speculative
from memrl.policy.engine.hf import HFPolicy
from memrl.policy.engine.kv_cache import PreallocatedLayer
from memrl.policy.engine.speculative import propose
from memrl.testing import random_tiny_llama


@pytest.fixture(scope="module")
def model_tok():
    # peaked logits: greedy and sampled replies fall into loops that prompt lookup can draft
    return random_tiny_llama(seed=3, initializer_range=0.3)


def policy(model_tok, k: int, **cfg) -> HFPolicy:
    model, tok = model_tok
    return HFPolicy.from_model(
        model, tok, PolicyConfig(model="random-peaked", seed=0, speculative_tokens=k, **cfg)
    )


def enc(p: HFPolicy, text: str) -> tuple[int, ...]:
    return tuple(p.tokenizer.encode(text, add_special_tokens=False))


def fed_per_forward(p: HFPolicy, requests):
    """``p``'s outputs and the tokens fed per row in each of its forwards (1: a plain decode step)."""
    fed: list[int] = []
    hook = p.model.register_forward_pre_hook(
        lambda _m, _a, kw: fed.append(int(kw["input_ids"].shape[1])), with_kwargs=True
    )
    try:
        return p.generate(requests), fed
    finally:
        hook.remove()


def test_propose_copies_what_followed_the_latest_longest_match():
    seq = [5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    assert propose(seq, 3) == [4, 7, 1]  # "1 2" last seen before 4 (latest), not before 3
    assert propose([8, 1, 2, 3, 6, 2, 3, 1, 2, 3], 2) == [6, 2]  # "1 2 3" (n = 3) beats the later "2 3"
    assert propose(seq, 1) == [4]
    assert propose([1, 2, 3, 4], 3) == []  # the last token is new
    assert propose([7, 7], 5) == [7]  # only what exists after the match
    assert propose([3, 1, 3], 0) == []


def test_greedy_and_sampled_rows_write_what_plain_decoding_writes(model_tok):
    plain, spec = policy(model_tok, 0), policy(model_tok, 4)
    prompts = [enc(plain, t) for t in ("Ann: I moved to Rome. Tom: Rome?", "abcabcabc", "x", "Mia: hi " * 5)]
    requests = [
        *(GenerationRequest(p, SamplingParams(temperature=0.0, max_tokens=40)) for p in prompts),
        *(
            GenerationRequest(p, SamplingParams(temperature=1.0, max_tokens=30, n=2, seed=11))
            for p in prompts
        ),
    ]
    (ref, fed_plain), (out, fed_spec) = fed_per_forward(plain, requests), fed_per_forward(spec, requests)
    assert [[o.token_ids for o in outs] for outs in out] == [[o.token_ids for o in outs] for outs in ref]
    for outs, refs in zip(out, ref, strict=True):
        for o, r in zip(outs, refs, strict=True):
            assert o.finish_reason == r.finish_reason
            assert torch.allclose(torch.tensor(o.logprobs), torch.tensor(r.logprobs), atol=1e-4)
    stats = spec.forward_stats
    assert 0 < stats["accepted_tokens"] <= stats["draft_tokens"]
    assert max(fed_plain[1:]) == 1 and max(fed_spec[1:]) > 1


def oracle_drafts(monkeypatch, replies: dict[tuple[int, ...], tuple[int, ...]]) -> None:
    """Draft each row's next tokens of its known reply instead of by prompt lookup."""

    def oracle(tokens, k, max_ngram=3):
        prompt = next(p for p in replies if tuple(tokens[: len(p)]) == p)
        done = len(tokens) - len(prompt)
        return list(replies[prompt][done : done + k])

    monkeypatch.setattr(speculative, "propose", oracle)


def test_right_drafts_emit_k_plus_one_tokens_a_step(model_tok, monkeypatch):
    """With drafts that are the plain replies (an oracle in place of prompt lookup), each step keeps all ``k``
    of them: a 40-token reply takes 8 checking steps instead of 39 decode steps."""
    plain, spec = policy(model_tok, 0), policy(model_tok, 4)
    prompts = [enc(plain, t) for t in ("Ann: I moved to Rome.", "abcabc")]
    requests = [GenerationRequest(p, SamplingParams(temperature=0.0, max_tokens=40)) for p in prompts]
    ref, fed_plain = fed_per_forward(plain, requests)
    oracle_drafts(monkeypatch, {p: r[0].token_ids for p, r in zip(prompts, ref, strict=True)})
    out, fed_spec = fed_per_forward(spec, requests)
    assert [o[0].token_ids for o in out] == [r[0].token_ids for r in ref]
    assert len(fed_plain) == 1 + 39 and len(fed_spec) == 1 + 8  # a prefill, then (40 - 1) / (4 + 1) steps


def test_a_kept_draft_never_runs_past_a_stop_string_or_the_budget(model_tok, monkeypatch):
    """Drafts run on past where each request must stop (the free reply's next tokens): none of them is kept."""
    plain, spec = policy(model_tok, 0), policy(model_tok, 8)
    prompt = enc(plain, "abababababab")
    [[free]] = plain.generate([GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=30))])
    oracle_drafts(monkeypatch, {prompt: free.token_ids})
    text = plain.tokenizer.decode(list(free.token_ids))
    stop = text[5:7]  # a string the free reply writes after a few tokens
    requests = [
        GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=30, stop=[stop])),
        GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=3)),
        GenerationRequest(
            prompt, SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[free.token_ids[6]])
        ),
    ]
    ref, out = plain.generate(requests), spec.generate(requests)
    for [o], [r] in zip(out, ref, strict=True):
        assert (o.token_ids, o.finish_reason, o.stop_reason) == (r.token_ids, r.finish_reason, r.stop_reason)
    assert len(out[0][0].token_ids) < 30 and len(out[1][0].token_ids) == 3 and len(out[2][0].token_ids) <= 7
    assert spec.forward_stats["accepted_tokens"] > 0


def test_rows_joining_a_speculating_batch_and_the_states_it_leaves_in_the_cache(model_tok):
    """Rows admitted into a batch whose rows have masked (rejected-draft) columns, and a request continuing from
    the states such a row left in the radix cache, decode as they would plainly."""
    plain = policy(model_tok, 0, max_batch_size=2, prefix_cache_tokens=0)
    spec = policy(model_tok, 4, max_batch_size=2)
    prompts = [enc(plain, f"Tom {i}: " + "la " * (i + 1)) for i in range(5)]
    requests = [
        GenerationRequest(p, SamplingParams(temperature=0.0, max_tokens=12 + 3 * i))
        for i, p in enumerate(prompts)
    ]
    ref, out = plain.generate(requests), spec.generate(requests)
    assert [o[0].token_ids for o in out] == [r[0].token_ids for r in ref]
    follow = GenerationRequest(
        prompts[4] + out[4][0].token_ids + enc(plain, " Ann:"), SamplingParams(temperature=0.0, max_tokens=10)
    )
    [[cont]], [[cold]] = spec.generate([follow]), plain.generate([follow])
    assert cont.cached_tokens >= len(prompts[4]) + len(out[4][0].token_ids) - 1
    assert cont.token_ids == cold.token_ids
    assert torch.allclose(torch.tensor(cont.logprobs), torch.tensor(cold.logprobs), atol=1e-4)


def test_a_cache_layer_grows_keeping_its_states_and_truncates_to_a_view():
    layer = PreallocatedLayer(capacity=4)
    k = torch.arange(2 * 3 * 3 * 2, dtype=torch.float32).reshape(2, 3, 3, 2)
    layer.update(k, -k)
    layer.reserve(1)
    assert layer.capacity == 4  # room enough
    layer.reserve(3)
    assert layer.capacity >= 6 and torch.equal(layer.keys, k) and torch.equal(layer.values, -k)
    layer.update(k[:, :, :2] + 100, k[:, :, :2])
    layer.truncate(4)
    assert layer.get_seq_length() == 4 and torch.equal(layer.keys[:, :, 3], k[:, :, 0] + 100)


def test_speculative_tokens_must_not_be_negative():
    with pytest.raises(ValueError, match="speculative_tokens"):
        PolicyConfig(speculative_tokens=-1)


def test_a_wide_batch_drafts_fewer_tokens_a_row_and_the_widest_none(model_tok, monkeypatch):
    spec = policy(model_tok, 4)
    monkeypatch.setattr(speculative, "propose", lambda tokens, k, max_ngram=3: [tokens[-1]] * k)

    def widest_step(rows: int) -> int:
        prompts = [enc(spec, f"row {i:02d}: abab") for i in range(rows)]  # one length: one prefill forward
        fed: list[int] = []
        hook = spec.model.register_forward_pre_hook(
            lambda _m, _a, kw: fed.append(int(kw["input_ids"].shape[1])), with_kwargs=True
        )
        try:
            spec.generate(
                [GenerationRequest(p, SamplingParams(temperature=0.0, max_tokens=12)) for p in prompts]
            )
        finally:
            hook.remove()
        return max(fed[1:])

    cap = speculative.MAX_CHECKED_POSITIONS
    assert widest_step(2) == 1 + 4
    assert widest_step(8) == cap // 8
    assert widest_step(cap // 2 + 1) == 1  # plain decode steps only
