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

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()


def preallocated_cache(num_layers: int, capacity: int, prefix=None) -> DynamicCache:
    """A DynamicCache of ``num_layers`` :class:`PreallocatedLayer`; ``prefix`` = per-layer ``(keys, values)``
    ``[B, heads, C, head_dim]`` written first."""
    cache = DynamicCache()
    cache.layers = [PreallocatedLayer(capacity) for _ in range(num_layers)]
    if prefix is not None:
        for layer, (k, v) in zip(cache.layers, prefix, strict=True):
            layer.update(k, v)
    return cache
