"""A KV-cache layer with pre-allocated capacity: decoding writes in place instead of ``torch.cat``-ing the
whole cache every step (the copy made decode O(n) per token and dominated small-model decoding).

The HF decode loop knows a batch's final length up front (cached + remaining prompt + max new tokens), so it sizes
the buffers once (and again when continuous batching merges newly admitted rows in). ``keys``/``values`` are
views ``[B, heads, length, head_dim]`` of the buffers.
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

    def row_states(self, b: int, real: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Row ``b``'s states at the positions where ``real`` (``[seq_length]`` bool) is set, from the
        ``start``-th such position on, as new tensors ``[heads, n, head_dim]``."""
        idx = real.nonzero().squeeze(1)[start:]
        return self.keys[b][:, idx], self.values[b][:, idx]  # index tensors: copies

    def reserve(self, n: int) -> None:
        """Room for ``n`` more positions, growing the buffers (one copy) if they lack it: a speculative step's
        rejected drafts leave masked columns, so a batch can outgrow the capacity its budgets asked for."""
        if self.length + n <= self.capacity:
            return
        self.capacity = self.length + max(n, self.capacity // 4)
        if self.is_initialized:
            b, h, _, d = self._k.shape
            k = self._k.new_empty((b, h, self.capacity, d))
            v = self._v.new_empty((b, h, self.capacity, self._v.shape[-1]))
            k[:, :, : self.length], v[:, :, : self.length] = self.keys, self.values
            self._k, self._v = k, v
            self._views()

    def truncate(self, length: int) -> None:
        """Forget every position from ``length`` on (drafted tokens no row kept); a view, no copy."""
        self.length = min(self.length, length)
        self._views()

    def drop_leading(self, n: int) -> None:
        """Forget the first ``n`` positions (columns no row attends to); a view, no copy."""
        self._k, self._v = self._k[:, :, n:], self._v[:, :, n:]
        self.capacity -= n
        self.length -= n
        self._views()


class SharedPrefixLayer(PreallocatedLayer):
    """A layer whose rows all continue from one shared prefix: its states ``[heads, C, head_dim]`` are held once
    (the stored entry's own tensors, no copy) and the buffers hold only each row's own positions.

    ``keys``/``values`` are the own positions; the sequence length includes the ``C = prefix.width`` prefix
    positions (masks and positions cover them); :mod:`memrl.policy.engine.shared_attention` attends to both."""

    def __init__(self, capacity: int, prefix, layer: int) -> None:
        super().__init__(capacity - prefix.width)
        self.prefix, self.layer = prefix, layer
        self.prefix_length = prefix.width

    def get_seq_length(self) -> int:
        return self.prefix_length + self.length

    def row_states(self, b: int, real: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        pk, pv = self.prefix.keys[self.layer], self.prefix.values[self.layer]
        C = self.prefix_length
        shown = real[:C].nonzero().squeeze(1)
        own = real[C:].nonzero().squeeze(1)
        if start >= len(shown):
            own = own[start - len(shown) :]
            return self.keys[b][:, own], self.values[b][:, own]
        shown = shown[start:]
        keys = torch.cat([pk[:, shown], self.keys[b][:, own]], dim=1)
        values = torch.cat([pv[:, shown], self.values[b][:, own]], dim=1)
        return keys, values


class SharedPrefixCache(DynamicCache):
    """A cache of :class:`SharedPrefixLayer`; ``prefix`` (a ``SharedPrefix``) goes to the attention function."""

    def __init__(self, capacity: int, prefix, num_layers: int) -> None:
        super().__init__()
        self.prefix = prefix
        self.layers = [SharedPrefixLayer(capacity, prefix, li) for li in range(num_layers)]


def shared_prefix_cache(entry, length: int, capacity: int) -> SharedPrefixCache:
    """A cache for rows that all continue from the first ``length`` positions of the stored ``entry`` (no copy
    of the prefix is made)."""
    from memrl.policy.engine.shared_attention import SharedPrefix

    prefix = SharedPrefix(
        keys=[k[:, :length] for k in entry.keys], values=[v[:, :length] for v in entry.values]
    )
    return SharedPrefixCache(capacity, prefix, len(entry.keys))


def preallocated_cache(num_layers: int, capacity: int) -> DynamicCache:
    """An empty DynamicCache of ``num_layers`` :class:`PreallocatedLayer` (see :func:`prefix_filled_cache` for
    one that starts from reused states)."""
    cache = DynamicCache()
    cache.layers = [PreallocatedLayer(capacity) for _ in range(num_layers)]
    return cache


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


def _dense_states(layer: PreallocatedLayer) -> tuple[torch.Tensor, torch.Tensor]:
    """Every position of ``layer`` as ``[B, heads, T, head_dim]``, ``T`` = the batch's sequence length (a
    :class:`SharedPrefixLayer` writes its prefix into every row)."""
    if not isinstance(layer, SharedPrefixLayer):
        return layer.keys, layer.values
    B, H, S, D = layer.keys.shape
    C = layer.prefix_length
    pk, pv = layer.prefix.keys[layer.layer], layer.prefix.values[layer.layer]
    keys = layer.keys.new_empty((B, H, C + S, D))
    values = layer.values.new_empty((B, H, C + S, layer.values.shape[-1]))
    keys[:, :, :C], values[:, :, :C] = pk[None], pv[None]
    keys[:, :, C:], values[:, :, C:] = layer.keys, layer.values
    return keys, values


def concat_batches(
    parts: list[tuple[DynamicCache, torch.Tensor, torch.Tensor | None]], capacity: int
) -> tuple[DynamicCache, torch.Tensor]:
    """One pre-allocated cache and ``[B, T]`` mask holding, in order, the rows ``keep`` (all when ``None``) of
    every ``(cache, mask, keep)`` part, each part right-aligned to the longest ``T`` (zeros and mask 0 before
    it), with room for ``capacity`` positions. Continuous batching admits newly prefilled rows into a running
    batch this way, dropping its finished rows in the same copy; positions are per row, so they stay valid."""
    parts = [
        (c, m, torch.arange(m.shape[0], device=m.device) if keep is None else keep) for c, m, keep in parts
    ]
    T = max(mask.shape[1] for _, mask, _ in parts)
    # Columns no kept row uses (left padding common to all of them) are dropped: attention cost grows with the
    # width, and a long-running batch that keeps admitting rows would otherwise only ever get wider.
    lead = min(T - m.shape[1] + first_used(m[keep]) for _, m, keep in parts)
    width = T - lead
    skips = [max(0, lead - (T - m.shape[1])) for _, m, _ in parts]  # each part's own columns left out
    cache = preallocated_cache(len(parts[0][0].layers), capacity - lead)
    B = sum(len(keep) for _, _, keep in parts)
    for li, layer in enumerate(cache.layers):
        k = v = None
        start = 0
        for (part, mask, keep), skip in zip(parts, skips, strict=True):
            pk, pv = _dense_states(part.layers[li])
            if k is None:
                k = pk.new_empty((B, pk.shape[1], capacity - lead, pk.shape[-1]))
                v = pv.new_empty((B, pv.shape[1], capacity - lead, pv.shape[-1]))
            n, pad = len(keep), width - (mask.shape[1] - skip)
            k[start : start + n, :, :pad] = 0
            v[start : start + n, :, :pad] = 0
            k[start : start + n, :, pad:width] = pk[keep, :, skip:]
            v[start : start + n, :, pad:width] = pv[keep, :, skip:]
            start += n
        layer.adopt(k, v, width)
    masks = [
        torch.nn.functional.pad(mask[keep][:, skip:], (width - (mask.shape[1] - skip), 0))
        for (_, mask, keep), skip in zip(parts, skips, strict=True)
    ]
    return cache, torch.cat(masks)


def first_used(mask: torch.Tensor) -> int:
    """The first column of ``mask [B, T]`` that some row uses (``T`` when none does)."""
    used = mask.bool().any(0)
    return int(used.long().argmax()) if bool(used.any()) else mask.shape[1]
