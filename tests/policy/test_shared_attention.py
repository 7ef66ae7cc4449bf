"""Shared-prefix attention: exact against sdpa over the concatenated states, and in the HF backend."""

from __future__ import annotations

import pytest
import torch

from memrl.policy import kv_cache
from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.hf import HFPolicy
from memrl.policy.shared_attention import SharedPrefix, memrl_sdpa, shared_prefix_attention
from memrl.testing import random_tiny_llama


def _reference(query, groups, ok, ov, own, width, scaling):
    """sdpa over each row's [left pad | its group's prefix | own positions] layout (the per-row copies)."""
    B, H, q, D = query.shape
    Hkv = ok.shape[1]
    keys = torch.zeros(B, Hkv, width, D, dtype=query.dtype)
    values = torch.zeros_like(keys)
    pre_mask = torch.zeros(B, 1, q, width, dtype=torch.bool)
    for pk, pv, rows in groups:
        c = pk.shape[1]
        for r in rows:
            keys[r, :, width - c :], values[r, :, width - c :] = pk, pv
            pre_mask[r, ..., width - c :] = True
    keys = torch.cat([keys, ok], dim=2).repeat_interleave(H // Hkv, dim=1)
    values = torch.cat([values, ov], dim=2).repeat_interleave(H // Hkv, dim=1)
    full = torch.cat([pre_mask, own], dim=-1)
    ref = torch.nn.functional.scaled_dot_product_attention(query, keys, values, attn_mask=full, scale=scaling)
    return ref.transpose(1, 2)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "q", "group_rows"),
    [
        (3, 3, 1, [[0, 1, 2]]),
        (4, 2, 1, [[0, 1, 2]]),
        (4, 2, 3, [[0, 2], [1]]),
        (2, 1, 5, [[2], [0, 1]]),
        (3, 3, 1, [[1], [2], [0]]),
    ],
)
def test_equals_sdpa_over_per_row_copies(heads, kv_heads, q, group_rows):
    g = torch.Generator().manual_seed(heads * 10 + q + len(group_rows))
    B, S, D = 3, 6, 8
    dt = torch.float64
    query = torch.randn(B, heads, q, D, generator=g, dtype=dt)
    lengths = [17, 9, 12][: len(group_rows)]  # groups' prefixes differ in length: right-aligned in the width
    groups = [
        (
            torch.randn(kv_heads, c, D, generator=g, dtype=dt),
            torch.randn(kv_heads, c, D, generator=g, dtype=dt),
            rows,
        )
        for c, rows in zip(lengths, group_rows, strict=True)
    ]
    ok, ov = (torch.randn(B, kv_heads, S, D, generator=g, dtype=dt) for _ in range(2))
    # Own positions: row 1 left-padded by 2, row 2 by 4 (holes right after the prefix); causal among the last q.
    own = torch.ones(B, 1, q, S, dtype=torch.bool).tril(S - q)
    own[1, ..., :2] = False
    own[2, ..., :4] = False
    prefix = SharedPrefix(
        keys=[[pk] for pk, _, _ in groups],
        values=[[pv] for _, pv, _ in groups],
        rows=[torch.tensor(rows) for _, _, rows in groups],
    )
    out = shared_prefix_attention(query, ok, ov, prefix, 0, own, D**-0.5)
    assert out.shape == (B, q, heads, D)
    assert torch.allclose(out, _reference(query, groups, ok, ov, own, max(lengths), D**-0.5), atol=1e-10)


def test_select_keeps_groups_in_new_row_order():
    t = torch.zeros(1, 2, 1)
    prefix = SharedPrefix(
        keys=[[t], [t]], values=[[t], [t]], rows=[torch.tensor([0, 3]), torch.tensor([1, 2])]
    )
    prefix.select(torch.tensor([1, 3, 0]))  # row 2 left; rows renumbered 1->0, 3->1, 0->2
    assert [r.tolist() for r in prefix.rows] == [[1, 2], [0]]
    assert prefix.group_of(0) == 1 and prefix.group_of(2) == 0
    prefix.select(torch.tensor([2]))
    assert [r.tolist() for r in prefix.rows] == [[0]] and len(prefix.keys) == 1


def test_width_stays_when_the_longest_group_leaves():
    long, short = torch.zeros(1, 5, 1), torch.zeros(1, 2, 1)
    prefix = SharedPrefix(
        keys=[[long], [short]], values=[[long], [short]], rows=[torch.tensor([0]), torch.tensor([1])]
    )
    prefix.select(torch.tensor([1]))
    assert prefix.width == 5  # the cache still reserves 5 positions; the mask is cut there


def test_row_states_from_any_start_read_prefix_then_own_positions():
    """What a finished row leaves in the radix cache: its real positions from ``start`` on, across the group's
    shared prefix (right-aligned in the reserved width) and its own positions, equal to the dense layout."""
    from memrl.policy.radix_cache import PrefixStates

    g = torch.Generator().manual_seed(0)
    long, short = (torch.randn(2, c, 3, generator=g) for c in (5, 3))  # [heads, C_g, head_dim]
    groups = [(PrefixStates([long], [-long]), 5, [0]), (PrefixStates([short], [-short]), 3, [1])]
    cache = kv_cache.shared_prefix_cache(groups, capacity=5 + 4)
    layer = cache.layers[0]
    layer.update(torch.randn(2, 2, 4, 3, generator=g), torch.randn(2, 2, 4, 3, generator=g))
    real = torch.ones(2, 9, dtype=torch.bool)
    real[1, :2] = False  # row 1's shorter prefix leaves two masked columns
    real[0, 5] = False  # and a padding hole in row 0's own part
    dense_k, dense_v = kv_cache._dense_states(layer)
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


def _policy(mode: str) -> HFPolicy:
    model, tok = random_tiny_llama(
        seed=3, initializer_range=0.3, num_attention_heads=4, num_key_value_heads=2
    )
    return HFPolicy.from_model(
        model, tok, PolicyConfig(model="random-peaked", seed=0, shared_prefix_attention=mode)
    )


def _enc(policy, text: str) -> tuple[int, ...]:
    return tuple(policy.tokenizer.encode(text, add_special_tokens=False))


def _branches(policy: HFPolicy) -> list:
    """Two nodes of different lengths; from both, in ONE generate call, branches with suffixes of different
    lengths (padding holes) and different token budgets (rows leave the batch at different steps), each found in
    the radix cache; then a continuation of one branch (its own cached state)."""
    prompts = [_enc(policy, "Alice: I moved to Lisbon in May. " * 6), _enc(policy, "Bob has 3 cats. " * 5)]
    node_params = SamplingParams(temperature=0.0, max_tokens=8)
    nodes = [o[0] for o in policy.generate([GenerationRequest(p, node_params) for p in prompts])]
    suffixes = [(), _enc(policy, " <result>4</result>"), _enc(policy, "x"), _enc(policy, " <r>12</r>")]
    reqs = []
    for i, (p, node) in enumerate(zip(prompts, nodes, strict=True)):
        for j, s in enumerate(suffixes):
            params = SamplingParams(temperature=0.0, max_tokens=4 + 3 * j + i, top_logprobs=3)
            reqs.append(GenerationRequest(p + node.token_ids + s, params))
    outs = [o[0] for o in policy.generate(reqs)]
    first = outs[5]
    cont = reqs[5].prompt_ids + first.token_ids + _enc(policy, " ok")
    [[tail]] = policy.generate([GenerationRequest(cont, SamplingParams(temperature=0.0, max_tokens=8))])
    assert (
        tail.cached_tokens == len(cont) - len(_enc(policy, " ok")) - 1
    )  # the branch's own output was cached
    return outs + [tail]


def test_branches_of_two_nodes_equal_per_row_copies_and_recompute(monkeypatch):
    groups = []
    real = kv_cache.shared_prefix_cache
    monkeypatch.setattr(
        "memrl.policy.hf.shared_prefix_cache", lambda g, cap: groups.append(len(g)) or real(g, cap)
    )
    shared, copies = _policy("groups"), _policy("off")
    assert shared.shared_attention == "groups" and copies.shared_attention == "off"
    a, b = _branches(shared), _branches(copies)
    assert 2 in groups, "the two-group shared path was not taken"
    assert len({len(x.token_ids) for x in a}) > 3  # rows did leave the batch at different steps
    for x, y in zip(a, b, strict=True):
        assert x.token_ids == y.token_ids and x.cached_tokens == y.cached_tokens > 0
        assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
    # And both equal generating from scratch (no prefix state at all).
    fresh = _policy("one")
    refs = fresh.generate(
        [
            GenerationRequest(
                x.prompt_token_ids, SamplingParams(temperature=0.0, max_tokens=len(x.token_ids))
            )
            for x in a
        ]
    )
    assert [r[0].token_ids for r in refs] == [x.token_ids for x in a]


def test_default_mode_shares_only_when_every_row_continues_from_one_state(monkeypatch):
    groups = []
    real = kv_cache.shared_prefix_cache
    monkeypatch.setattr(
        "memrl.policy.hf.shared_prefix_cache", lambda g, cap: groups.append(len(g)) or real(g, cap)
    )
    one = _policy("one")
    assert one.shared_attention == "one"
    outs = _branches(one)  # one call with branches of two nodes (per-row copies), one of a single node
    assert groups == [1]
    ref = _branches(_policy("off"))
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    with pytest.raises(ValueError, match="valid: one, groups, off"):
        PolicyConfig(shared_prefix_attention="yes")
