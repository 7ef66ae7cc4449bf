"""Shared-prefix attention: exact against sdpa over the concatenated states, and in the HF backend."""

from __future__ import annotations

import pytest
import torch

from memrl.policy import kv_cache
from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.hf import HFPolicy
from memrl.policy.shared_attention import shared_prefix_attention
from memrl.policy.tiny_arch import random_tiny_llama


@pytest.mark.parametrize(("heads", "kv_heads", "q"), [(3, 3, 1), (4, 2, 1), (4, 2, 3), (2, 1, 5)])
def test_equals_sdpa_over_prefix_plus_own_states(heads, kv_heads, q):
    g = torch.Generator().manual_seed(heads * 10 + q)
    B, C, S, D = 3, 17, 6, 8
    query = torch.randn(B, heads, q, D, generator=g, dtype=torch.float64)
    pk, pv = (torch.randn(kv_heads, C, D, generator=g, dtype=torch.float64) for _ in range(2))
    ok, ov = (torch.randn(B, kv_heads, S, D, generator=g, dtype=torch.float64) for _ in range(2))
    # Own positions: row 1 left-padded by 2, row 2 by 4 (holes right after the prefix); causal among the last q.
    own = torch.ones(B, 1, q, S, dtype=torch.bool).tril(S - q)
    own[1, ..., :2] = False
    own[2, ..., :4] = False
    out = shared_prefix_attention(query, ok, ov, pk, pv, own, D**-0.5)

    rep = heads // kv_heads
    keys = torch.cat([pk.expand(B, -1, -1, -1), ok], dim=2).repeat_interleave(rep, dim=1)
    values = torch.cat([pv.expand(B, -1, -1, -1), ov], dim=2).repeat_interleave(rep, dim=1)
    full = torch.cat([torch.ones(B, 1, q, C, dtype=torch.bool), own], dim=-1)
    ref = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=full)
    assert out.shape == (B, q, heads, D)
    assert torch.allclose(out, ref.transpose(1, 2), atol=1e-10)


def _policy(shared: bool) -> HFPolicy:
    model, tok = random_tiny_llama(
        seed=3, initializer_range=0.3, num_attention_heads=4, num_key_value_heads=2
    )
    return HFPolicy.from_model(
        model, tok, PolicyConfig(model="random-peaked", seed=0, shared_prefix_attention=shared)
    )


def _enc(policy, text: str) -> tuple[int, ...]:
    return tuple(policy.tokenizer.encode(text, add_special_tokens=False))


def _branches(policy: HFPolicy, used: list[int]):
    """A kept node, four branches from it with suffixes of different lengths (padding holes), each kept, then
    one continuation from a branch's own kept state."""
    prompt = _enc(policy, "Alice: I moved to Lisbon in May. " * 6)
    keep = SamplingParams(temperature=0.0, max_tokens=8, keep_prefix=True, top_logprobs=3)
    [[node]] = policy.generate([GenerationRequest(prompt, keep)])
    base = prompt + node.token_ids
    suffixes = [(), _enc(policy, " <result>4</result>"), _enc(policy, "x"), _enc(policy, " <r>12</r>")]
    outs = policy.generate(
        [GenerationRequest(base + s, keep, prefix_handle=node.prefix_handle) for s in suffixes]
    )
    used.append(len(policy.prefix_cache))
    first = outs[1][0]
    cont = base + suffixes[1] + first.token_ids + _enc(policy, " ok")
    [[tail]] = policy.generate(
        [
            GenerationRequest(
                cont, SamplingParams(temperature=0.0, max_tokens=8), prefix_handle=first.prefix_handle
            )
        ]
    )
    policy.release([node.prefix_handle] + [o[0].prefix_handle for o in outs])
    return [o[0] for o in outs] + [tail]


def test_branches_of_one_node_equal_per_row_copies_and_recompute(monkeypatch):
    calls = []
    real = kv_cache.shared_prefix_cache
    monkeypatch.setattr("memrl.policy.hf.shared_prefix_cache", lambda *a: calls.append(a[1]) or real(*a))
    shared, copies = _policy(True), _policy(False)
    assert shared.shared_attention and not copies.shared_attention
    a, b = _branches(shared, []), _branches(copies, [])
    assert calls, "the shared path was not taken"
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.cached_tokens == y.cached_tokens > 0
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    # And both equal generating from scratch (no prefix state at all).
    fresh = _policy(True)
    [[ref]] = fresh.generate(
        [GenerationRequest(a[1].prompt_token_ids, SamplingParams(temperature=0.0, max_tokens=8))]
    )
    assert ref.token_ids == a[1].token_ids
