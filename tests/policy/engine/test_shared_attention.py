"""Shared-prefix attention: exact against sdpa over the concatenated states, and in the HF backend."""

from __future__ import annotations

import pytest
import torch

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine import kv_cache, shared_attention
from memrl.policy.engine.hf import HFPolicy
from memrl.policy.engine.shared_attention import (
    SharedPrefix,
    causal_tail_attention,
    decode_attention,
    memrl_sdpa,
    shared_prefix_attention,
)
from memrl.testing import random_tiny_llama


def _reference(query, pk, pv, ok, ov, own, scaling):
    """sdpa over each row's [prefix | own positions] layout (per-row copies of the prefix)."""
    B, H, q, _ = query.shape
    Hkv = ok.shape[1]
    keys = torch.cat([pk[None].expand(B, -1, -1, -1), ok], dim=2).repeat_interleave(H // Hkv, dim=1)
    values = torch.cat([pv[None].expand(B, -1, -1, -1), ov], dim=2).repeat_interleave(H // Hkv, dim=1)
    full = torch.cat([torch.ones(B, 1, q, pk.shape[1], dtype=torch.bool), own], dim=-1)
    ref = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=full, scale=scaling)
    return ref.transpose(1, 2)


@pytest.mark.parametrize(("heads", "kv_heads", "q"), [(3, 3, 1), (4, 2, 1), (4, 2, 3), (2, 1, 5)])
def test_equals_sdpa_over_per_row_copies(heads, kv_heads, q):
    g = torch.Generator().manual_seed(heads * 10 + q)
    B, C, S, D = 3, 17, 6, 8
    dt = torch.float64
    query = torch.randn(B, heads, q, D, generator=g, dtype=dt)
    pk, pv = (torch.randn(kv_heads, C, D, generator=g, dtype=dt) for _ in range(2))
    ok, ov = (torch.randn(B, kv_heads, S, D, generator=g, dtype=dt) for _ in range(2))
    # Own positions: row 1 left-padded by 2, row 2 by 4 (holes right after the prefix); causal among the last q.
    own = torch.ones(B, 1, q, S, dtype=torch.bool).tril(S - q)
    own[1, ..., :2] = False
    own[2, ..., :4] = False
    out = shared_prefix_attention(query, ok, ov, SharedPrefix(keys=[pk], values=[pv]), 0, own, D**-0.5)
    assert out.shape == (B, q, heads, D)
    assert torch.allclose(out, _reference(query, pk, pv, ok, ov, own, D**-0.5), atol=1e-10)


def test_row_states_from_any_start_read_prefix_then_own_positions():
    """What a finished row leaves in the radix cache: its real positions from ``start`` on, across the shared
    prefix and its own positions, equal to the dense layout."""
    from memrl.policy.engine.radix_cache import PrefixStates

    g = torch.Generator().manual_seed(0)
    prefix = torch.randn(2, 5, 3, generator=g)  # [heads, C, head_dim]
    cache = kv_cache.shared_prefix_cache(PrefixStates([prefix], [-prefix]), 5, capacity=5 + 4)
    layer = cache.layers[0]
    layer.update(torch.randn(2, 2, 4, 3, generator=g), torch.randn(2, 2, 4, 3, generator=g))
    real = torch.ones(2, 9, dtype=torch.bool)
    real[0, 5] = False  # a padding hole in row 0's own part
    real[1, 5:7] = False  # row 1 padded by two
    dense_k, dense_v = kv_cache._dense_states(layer)
    assert torch.equal(dense_k[:, :, :5], prefix[None].expand(2, -1, -1, -1))
    for b in (0, 1):
        full_k = dense_k[b][:, real[b]]
        for start in range(full_k.shape[1] + 1):
            k, v = layer.row_states(b, real[b], start)
            assert torch.equal(k, full_k[:, start:]) and torch.equal(v, dense_v[b][:, real[b]][:, start:])


def test_padded_gqa_attention_skips_the_head_copies_and_equals_transformers_sdpa(monkeypatch):
    from transformers.integrations import sdpa_attention

    g = torch.Generator().manual_seed(5)
    B, H, Hkv, q, S, D = 3, 4, 2, 2, 7, 8
    query = torch.randn(B, H, q, D, generator=g, dtype=torch.float64)
    key, value = (torch.randn(B, Hkv, S, D, generator=g, dtype=torch.float64) for _ in range(2))
    mask = torch.ones(B, 1, q, S, dtype=torch.bool).tril(S - q)
    mask[1, ..., :3] = False  # left padding
    module = torch.nn.Module()
    module.num_key_value_groups, module.layer_idx, module.is_causal = H // Hkv, 0, True
    ref, _ = sdpa_attention.sdpa_attention_forward(module, query, key, value, mask, scaling=0.3)

    def no_copy(*_a, **_k):
        raise AssertionError("repeat_kv copied the key/value heads")

    monkeypatch.setattr(sdpa_attention, "repeat_kv", no_copy)
    out, _ = memrl_sdpa(module, query, key, value, mask, scaling=0.3)
    assert out.shape == (B, q, H, D)
    assert torch.allclose(out, ref, atol=1e-12)
    with pytest.raises(AssertionError, match="repeat_kv"):  # float masks still take transformers' path
        memrl_sdpa(module, query, key, value, mask.to(torch.float64), scaling=0.3)


@pytest.mark.parametrize(("cached", "q", "dtype", "rows", "up_to"), [
    (0, 9, torch.float32, 192, 768), (13, 9, torch.float32, 192, 768), (40, 3, torch.float32, 192, 768),
    (13, 9, torch.bfloat16, 192, 768), (0, 30, torch.float32, 7, 768), (13, 30, torch.float32, 7, 768),
    (13, 30, torch.bfloat16, 7, 768), (13, 30, torch.float32, 7, 29),
])  # fmt: skip
def test_causal_tail_equals_sdpa_under_the_offset_causal_mask(cached, q, dtype, rows, up_to, monkeypatch):
    """The tail of a prompt after ``cached`` prefix positions (or a whole prompt), in pieces of ~``rows`` queries
    up to ``up_to`` queries (one piece above): each piece's past and own causal square merged by their log-sum-exp
    equal one masked attention over everything (grouped heads, no copies)."""
    monkeypatch.setattr(shared_attention, "TAIL_PIECE_ROWS", rows)
    monkeypatch.setattr(shared_attention, "TAIL_PIECES_UP_TO", up_to)
    calls = []
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    monkeypatch.setattr(shared_attention.torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu",
                        lambda *a, **k: calls.append(a[0].shape[2]) or flash(*a, **k), raising=False)  # fmt: skip
    g = torch.Generator().manual_seed(cached + q)
    B, H, Hkv, D = 2, 4, 2, 16
    S = cached + q
    query = torch.randn(B, H, q, D, generator=g).to(dtype)
    key, value = (torch.randn(B, Hkv, S, D, generator=g).to(dtype) for _ in range(2))
    mask = torch.ones(q, S, dtype=torch.bool).tril(S - q)
    ref = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key.double().repeat_interleave(2, 1), value.double().repeat_interleave(2, 1),
        attn_mask=mask, scale=0.3,
    ).transpose(1, 2)  # fmt: skip
    out = causal_tail_attention(query, key, value, 0.3)
    assert out.shape == (B, q, H, D) and out.dtype == dtype
    pieces = max(1, round(q / rows)) if q <= up_to else 1
    assert len(calls) == 2 * pieces - (cached == 0) and sum(calls) == 2 * q - (calls[0] if cached == 0 else 0)
    assert torch.allclose(out.double(), ref, atol=1e-5 if dtype == torch.float32 else 3e-2)
    module = torch.nn.Module()
    module.num_key_value_groups, module.layer_idx, module.is_causal = H // Hkv, 0, True
    via, _ = memrl_sdpa(module, query, key, value, mask[None, None].expand(B, 1, q, S), scaling=0.3,
                        memrl_causal_tail=True)  # fmt: skip
    assert torch.equal(via, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("padded", [True, False])
def test_a_decode_step_reads_each_key_value_head_once_and_equals_sdpa(dtype, padded):
    g = torch.Generator().manual_seed(7)
    B, H, Hkv, T, D = 3, 6, 2, 11, 16
    query = torch.randn(B, H, 1, D, generator=g).to(dtype)
    key, value = (torch.randn(B, Hkv, T, D, generator=g).to(dtype) for _ in range(2))
    mask = torch.ones(B, 1, 1, T, dtype=torch.bool)
    mask[1, ..., :4] = False  # left padding
    ref = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key.double().repeat_interleave(3, 1), value.double().repeat_interleave(3, 1),
        attn_mask=mask if padded else None, scale=0.3,
    ).transpose(1, 2)  # fmt: skip
    out = decode_attention(query, key, value, mask if padded else None, 0.3)
    assert out.shape == (B, 1, H, D) and out.dtype == dtype
    assert torch.allclose(out.double(), ref, atol=1e-5 if dtype == torch.float32 else 2e-2)
    module = torch.nn.Module()
    module.num_key_value_groups, module.layer_idx, module.is_causal = H // Hkv, 0, True
    via, _ = memrl_sdpa(module, query, key, value, mask if padded else None, scaling=0.3)
    assert torch.equal(via, out)


def test_a_speculative_step_attends_its_few_queries_under_their_mask_as_sdpa():
    g = torch.Generator().manual_seed(8)
    B, H, Hkv, T, q, D = 2, 6, 2, 12, 4, 16
    query = torch.randn(B, H, q, D, generator=g)
    key, value = (torch.randn(B, Hkv, T, D, generator=g) for _ in range(2))
    mask = torch.ones(B, 1, q, T, dtype=torch.bool)
    mask[..., T - q :] = torch.ones(q, q, dtype=torch.bool).tril()  # the drafted positions, causal
    mask[1, ..., :3] = False  # left padding
    mask[1, ..., 5] = False  # a rejected draft's column
    ref = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key.double().repeat_interleave(3, 1), value.double().repeat_interleave(3, 1),
        attn_mask=mask, scale=0.3,
    ).transpose(1, 2)  # fmt: skip
    module = torch.nn.Module()
    module.num_key_value_groups, module.layer_idx, module.is_causal = H // Hkv, 0, True
    out, _ = memrl_sdpa(module, query, key, value, mask, scaling=0.3, memrl_draft_check=True)
    assert out.shape == (B, q, H, D)
    assert torch.allclose(out.double(), ref, atol=1e-5)


def test_a_prompt_after_its_cached_prefix_takes_the_causal_tail_and_decodes_as_from_scratch(monkeypatch):
    calls = []
    real = shared_attention.causal_tail_attention
    monkeypatch.setattr(
        shared_attention, "causal_tail_attention", lambda q, *a: calls.append(q.shape[2]) or real(q, *a)
    )
    warm, cold = _policy(True), _policy(True)
    prefix = _enc(warm, "You keep the memory of a conversation. " * 4)
    params = SamplingParams(temperature=0.0, max_tokens=6)
    warm.generate([GenerationRequest(prefix, SamplingParams(temperature=0.0, max_tokens=1))])
    calls.clear()
    prompt = prefix + _enc(warm, " Ann: I moved to Rome in May. Tom: nice.")
    [[out]] = warm.generate([GenerationRequest(prompt, params)])
    assert out.cached_tokens >= len(prefix) - 1 and calls and calls[0] == len(prompt) - out.cached_tokens
    [[ref]] = cold.generate([GenerationRequest(prompt, params)])
    assert ref.cached_tokens == 0 and ref.token_ids == out.token_ids
    assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(ref.logprobs), atol=1e-4)


def _policy(shared: bool) -> HFPolicy:
    model, tok = random_tiny_llama(
        seed=3, initializer_range=0.3, num_attention_heads=4, num_key_value_heads=2
    )
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="random-peaked", seed=0))
    assert policy.shared_attention  # the model supports it
    policy.shared_attention = shared  # False: per-row copies of the prefix, the reference
    return policy


def _enc(policy, text: str) -> tuple[int, ...]:
    return tuple(policy.tokenizer.encode(text, add_special_tokens=False))


def _branches(policy: HFPolicy) -> list:
    """Branches of one node in ONE generate call, with suffixes of different lengths (padding holes) and
    different token budgets (rows leave the batch at different steps), each found in the radix cache; then
    branches of two nodes in one call (two states: per-row copies); then a continuation of one branch (its own
    cached state)."""
    prompts = [_enc(policy, "Alice: I moved to Lisbon in May. " * 6), _enc(policy, "Bob has 3 cats. " * 5)]
    node_params = SamplingParams(temperature=0.0, max_tokens=8)
    nodes = [o[0] for o in policy.generate([GenerationRequest(p, node_params) for p in prompts])]
    suffixes = [(), _enc(policy, " <result>4</result>"), _enc(policy, "x"), _enc(policy, " <r>12</r>")]
    reqs = []
    for i, (p, node) in enumerate(zip(prompts, nodes, strict=True)):
        for j, s in enumerate(suffixes):
            params = SamplingParams(temperature=0.0, max_tokens=4 + 3 * j + i, top_logprobs=3)
            reqs.append(GenerationRequest(p + node.token_ids + s, params))
    outs = [o[0] for o in policy.generate(reqs[:4])]  # one node
    outs += [o[0] for o in policy.generate(reqs)]  # both nodes
    first = outs[-3]
    cont = reqs[5].prompt_ids + first.token_ids + _enc(policy, " ok")
    [[tail]] = policy.generate([GenerationRequest(cont, SamplingParams(temperature=0.0, max_tokens=8))])
    assert (
        tail.cached_tokens == len(cont) - len(_enc(policy, " ok")) - 1
    )  # the branch's own output was cached
    return outs + [tail]


def test_branches_on_one_prefix_equal_per_row_copies_and_recompute(monkeypatch):
    calls = []
    real = kv_cache.shared_prefix_cache
    monkeypatch.setattr(
        "memrl.policy.engine.hf.shared_prefix_cache",
        lambda entry, length, cap: calls.append(length) or real(entry, length, cap),
    )
    shared, copies = _policy(True), _policy(False)
    a = _branches(shared)
    assert len(calls) == 1, "one node's branches share their prefix; two nodes and a lone continuation do not"
    calls.clear()
    b = _branches(copies)
    assert not calls
    # The shared rows did leave the batch at different steps.
    assert len({len(x.token_ids) for x in a[:4]}) > 3
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.cached_tokens == y.cached_tokens > 0
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    # And both equal generating from scratch (no prefix state at all).
    fresh = _policy(True)
    refs = fresh.generate(
        [
            GenerationRequest(
                x.prompt_token_ids, SamplingParams(temperature=0.0, max_tokens=len(x.token_ids))
            )
            for x in a
        ]
    )
    assert [r[0].token_ids for r in refs] == [x.token_ids for x in a]
