"""A KV-cache layer with pre-allocated capacity: decoding writes in place instead of ``torch.cat``-ing the
whole cache every step (the copy made decode O(n) per token and dominated small-model decoding).

The HF decode loop knows every sub-batch's final length up front (cached + remaining prompt + max new tokens), so
it sizes the buffers once. ``keys``/``values`` are views ``[B, heads, length, head_dim]`` of the buffers.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class PreallocatedLayer(DynamicLayer):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        # Uninitialised is safe: only [:length] is ever read, and every slot there is written first.
        self._k = key_states.new_empty((b, h, self.capacity, d))
        self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        if self.length + n > self.capacity:
            raise RuntimeError(f"KV cache capacity {self.capacity} exceeded ({self.length} + {n})")
        self._k[:, :, self.length : self.length + n] = key_states
        self._v[:, :, self.length : self.length + n] = value_states
        self.length += n
        self._views()
        return self.keys, self.values

    def _views(self) -> None:
        self.keys = self._k[:, :, : self.length]
        self.values = self._v[:, :, : self.length]

    def get_seq_length(self) -> int:
        return self.length

    def adopt(self, keys: torch.Tensor, values: torch.Tensor, length: int) -> None:
        """Take ``[B, heads, capacity, head_dim]`` buffers whose first ``length`` positions are already filled
        (the reused prefixes, written in place: no second copy)."""
        self.dtype, self.device = keys.dtype, keys.device
        self._k, self._v, self.length = keys, values, length
        self.is_initialized = True
        self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

    def row_states(self, b: int, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``b``'s states at the positions where ``real`` (``[seq_length]`` bool) is set, as new tensors."""
        return self.keys[b][:, real].clone(), self.values[b][:, real].clone()


class SharedPrefixLayer(PreallocatedLayer):
    """A layer whose rows all continue from one prefix: the prefix states ``[heads, C, head_dim]`` are held once
    (the stored entry's own tensors, no copy) and the buffers hold only each row's own positions.

    ``keys``/``values`` are the own positions; the sequence length includes the prefix (masks and positions
    cover it); :mod:`memrl.policy.shared_attention` attends to both."""

    def __init__(self, capacity: int, prefix_keys: torch.Tensor, prefix_values: torch.Tensor) -> None:
        super().__init__(capacity - prefix_keys.shape[-2])
        self.prefix_keys, self.prefix_values = prefix_keys, prefix_values
        self.prefix_length = int(prefix_keys.shape[-2])

    def get_seq_length(self) -> int:
        return self.prefix_length + self.length

    def row_states(self, b: int, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        C = self.prefix_length
        keys = torch.cat([self.prefix_keys[:, real[:C]], self.keys[b][:, real[C:]]], dim=1)
        values = torch.cat([self.prefix_values[:, real[:C]], self.values[b][:, real[C:]]], dim=1)
        return keys, values


class SharedPrefixCache(DynamicCache):
    """A cache of :class:`SharedPrefixLayer`; ``prefix`` is what the attention function needs per layer."""

    def __init__(self, capacity: int, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        from memrl.policy.shared_attention import SharedPrefix

        super().__init__()
        self.layers = [SharedPrefixLayer(capacity, k, v) for k, v in zip(keys, values, strict=True)]
        self.prefix = SharedPrefix(list(keys), list(values))


def preallocated_cache(num_layers: int, capacity: int) -> DynamicCache:
    """An empty DynamicCache of ``num_layers`` :class:`PreallocatedLayer` (see :func:`prefix_filled_cache` for
    one that starts from reused states)."""
    cache = DynamicCache()
    cache.layers = [PreallocatedLayer(capacity) for _ in range(num_layers)]
    return cache


def shared_prefix_cache(entry, C: int, capacity: int) -> SharedPrefixCache:
    """A cache for rows that all continue from the first ``C`` positions of one stored ``entry`` (no copy)."""
    keys = [k[:, :C] for k in entry.keys]
    values = [v[:, :C] for v in entry.values]
    return SharedPrefixCache(capacity, keys, values)


def prefix_filled_cache(
    num_layers: int, capacity: int, prefixes: list[tuple[object, int]], C: int
) -> DynamicCache:
    """A pre-allocated cache whose row ``i`` starts with ``prefixes[i] = (entry, c_i)``: the entry's first
    ``c_i`` key/value states right-aligned in ``[0, C)`` and zeros before them (masked out, but finite).

    States are written straight into the capacity buffers. Rows continuing from one shared entry (tree
    branches forked at the same node) are filled by a single broadcast copy."""
    cache = preallocated_cache(num_layers, capacity)
    ref = next(e for e, c in prefixes if e is not None and c > 0)
    B = len(prefixes)
    shared = all(e is ref and c == C for e, c in prefixes)
    for li, layer in enumerate(cache.layers):
        rk, rv = ref.keys[li], ref.values[li]
        k = rk.new_empty((B, rk.shape[0], capacity, rk.shape[-1]))
        v = rv.new_empty((B, rv.shape[0], capacity, rv.shape[-1]))
        if shared:
            k[:, :, :C] = rk[None, :, :C]
            v[:, :, :C] = rv[None, :, :C]
        else:
            for i, (entry, c) in enumerate(prefixes):
                c = c if entry is not None else 0
                k[i, :, : C - c] = 0
                v[i, :, : C - c] = 0
                if c:
                    k[i, :, C - c : C] = entry.keys[li][:, :c]
                    v[i, :, C - c : C] = entry.values[li][:, :c]
        layer.adopt(k, v, C)
    return cache
