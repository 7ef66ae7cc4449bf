"""The transformers internals memrl relies on (memrl.policy.engine.transformers_compat, docs/internals.md): present in the
installed version, and a mismatch is reported naming the internal and its user in memrl."""

from __future__ import annotations

import pytest
import torch
import transformers
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from memrl.policy.engine import transformers_compat as compat
from memrl.policy.engine.kv_cache import PreallocatedLayer, preallocated_cache
from memrl.testing.models import random_tiny_llama


def test_installed_transformers_has_every_internal_memrl_uses():
    problems = compat.check()
    assert not problems, f"transformers {transformers.__version__} is incompatible with memrl:\n" + "\n".join(
        problems
    )


def test_a_changed_signature_is_reported_naming_the_internal(monkeypatch):
    def lazy_initialization(self, key_states):  # the 4.x form
        pass

    monkeypatch.setattr(DynamicLayer, "lazy_initialization", lazy_initialization)
    (msg,) = [m for m in compat.check() if "lazy_initialization" in m]
    assert "transformers.cache_utils.DynamicLayer.lazy_initialization" in msg
    assert "PreallocatedLayer" in msg and "(self, key_states, value_states, ...)" in msg


def test_a_new_required_parameter_is_reported(monkeypatch):
    def update(self, key_states, value_states, layer_idx, cache_kwargs):
        pass

    monkeypatch.setattr(DynamicLayer, "update", update)
    (msg,) = [m for m in compat.check() if "DynamicLayer.update" in m]
    assert "now requires (layer_idx, cache_kwargs)" in msg


def test_a_missing_internal_is_reported(monkeypatch):
    from transformers.cache_utils import Cache

    monkeypatch.delattr(Cache, "batch_repeat_interleave")
    (msg,) = compat.check()
    assert "cache_utils.Cache.batch_repeat_interleave" in msg and "is missing" in msg
    assert "memrl.train.microbatch" in msg


def test_a_new_abstract_layer_hook_is_reported(monkeypatch):
    monkeypatch.setattr(PreallocatedLayer, "__abstractmethods__", frozenset({"new_hook"}))
    (msg,) = compat.check()
    assert "CacheLayerMixin" in msg and "new_hook" in msg


def test_memrl_layers_serve_transformers_cache_calls():
    cache = preallocated_cache(num_layers=2, capacity=8)
    assert isinstance(cache, DynamicCache) and all(isinstance(layer, DynamicLayer) for layer in cache.layers)
    k, v = torch.randn(2, 2, 3, 4), torch.randn(2, 2, 3, 4)
    keys, values = cache.update(k, v, 1)  # what an attention layer calls
    assert torch.equal(keys, k) and torch.equal(values, v)
    assert cache.get_seq_length(1) == 3 and cache.get_seq_length(0) == 0
    cache.update(k[:, :, :1], v[:, :, :1], 1)
    assert cache.get_seq_length(1) == 4 and cache.layers[1].keys.shape == (2, 2, 4, 4)
    cache.batch_select_indices(torch.tensor([1]))
    assert torch.equal(cache.layers[1].keys[0, :, :3], k[1])


def test_forward_kwargs_reach_a_registered_attention_function_with_memrl_layers():
    """What memrl_sdpa needs from a model forward: a registered attention implementation is called with each
    module's ``layer_idx``, unknown forward kwargs (``memrl_shared_prefix``) arrive in its kwargs, and the
    cache's ``update`` lands in memrl's pre-allocated layers."""
    seen: list[tuple[int, object]] = []

    def probe(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        seen.append((module.layer_idx, kwargs.pop("memrl_probe", None)))
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling
        )

    AttentionInterface.register("memrl_probe", probe)
    ALL_MASK_ATTENTION_FUNCTIONS.register("memrl_probe", sdpa_mask)
    model, _ = random_tiny_llama()
    reference = model(input_ids=torch.tensor([[5, 6, 7]]), use_cache=False).logits
    model.set_attn_implementation("memrl_probe")
    cache = preallocated_cache(model.config.num_hidden_layers, capacity=8)
    token = object()
    out = model(input_ids=torch.tensor([[5, 6, 7]]), past_key_values=cache, use_cache=True, memrl_probe=token)
    assert seen == [(i, token) for i in range(model.config.num_hidden_layers)]
    assert all(layer.length == 3 for layer in cache.layers)
    torch.testing.assert_close(out.logits, reference)


@pytest.mark.parametrize("internal", compat.INTERNALS, ids=lambda i: i.path)
def test_each_internal_resolves(internal):
    assert compat.check_internal(internal) is None
