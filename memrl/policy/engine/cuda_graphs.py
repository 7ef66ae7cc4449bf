"""Decode steps replayed from captured CUDA graphs (``policy.cuda_graphs``, on by default on CUDA).

A decode step of a model as small as SmolLM2-135M is bound by kernel launches, not by the GPU: ~1,000 launches
a step (30 layers of norms, projections, RoPE and attention), each a few microseconds of host time, for a few
microseconds of GPU work each (docs/benchmarks.md measures it). A CUDA graph records one step's launches once
and replays them with a single call.

A graph needs fixed shapes and fixed memory, so a captured step works on static buffers:

* the batch is padded to a bucket of rows (``ROW_BUCKETS``) and its cache to a bucket of positions
  (a multiple of ``POSITION_BUCKET``); one graph is captured per bucket pair (and per weight mode, below) and
  all graphs share one memory pool;
* each layer's keys and values live in ``[rows, kv_heads, positions, head_dim]`` buffers that the graph writes
  in place at a column held in a device tensor (``index_copy_``), and attention runs over every position under
  a boolean mask that the host updates before each replay (unwritten columns are masked out and hold finite
  values: zeros, or an earlier batch's states);
* the running :class:`~memrl.policy.engine.batching.DecodeBatch`'s cache layers are views of the same buffers, so
  the engine's bookkeeping (storing finished rows in the prefix cache, dropping and admitting rows) reads what
  the graph wrote. A batch whose cache was rebuilt by that bookkeeping is copied into the buffers at its next
  step (once per admission or compaction, as the engine already copies).

What is recorded is the policy's forward as it stands at capture: the weights are read from their storage at
every replay (LoRA folding, adapter loading and optimizer steps all write in place), but which code runs (the
active adapter, folded or not, adapters disabled, train/eval mode, dtype) is part of the graph's key.

Rows that continue from one shared cached prefix (:class:`~memrl.policy.engine.kv_cache.SharedPrefixCache`: tree
branches of a node) keep the eager path: their attention reads the prefix once instead of a copy per row, a
different kernel sequence that these buffers do not hold.
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from memrl.policy.engine.kv_cache import PreallocatedLayer
from memrl.policy.engine.lora_merge import lora_layers

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
POSITION_BUCKET = 256
# Graphs kept at once: each holds its own key/value buffers (SmolLM2-135M, 32 rows x 1,024 positions in bfloat16:
# 0.75 GB); the least recently used free one goes first.
MAX_GRAPHS = 16


def _bucket_rows(n: int) -> int | None:
    return next((b for b in ROW_BUCKETS if b >= n), None)


def _bucket_positions(n: int) -> int:
    return -(-n // POSITION_BUCKET) * POSITION_BUCKET


class _StaticLayer(DynamicLayer):
    """One layer's static key/value buffers, written at the step's column (a device tensor) in place."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, column: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values, self.column = keys, values, column
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys.index_copy_(2, self.column, key_states)
        self.values.index_copy_(2, self.column, value_states)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.keys.shape[2]


class _StaticCache(DynamicCache):
    def __init__(self, layers: list[_StaticLayer]) -> None:
        super().__init__()
        self.layers = layers


class _Graph:
    """One captured decode step for ``rows`` rows (padded) over ``positions`` cache positions."""

    def __init__(
        self, decoder: GraphDecoder, rows: int, positions: int, template: PreallocatedLayer, num_layers: int
    ):
        policy, pool = decoder.policy, decoder.pool
        device = policy.device
        self.policy, self.decoder = policy, decoder
        self.rows, self.positions = rows, positions
        _, heads, _, head_dim = template._k.shape
        value_dim = template._v.shape[-1]
        zeros = dict(dtype=template._k.dtype, device=device)
        # Zeros, not empty: a masked-out column still enters attention's probability-weighted sum, 0 * NaN = NaN.
        self.keys = [torch.zeros((rows, heads, positions, head_dim), **zeros) for _ in range(num_layers)]
        self.values = [torch.zeros((rows, heads, positions, value_dim), **zeros) for _ in range(num_layers)]
        self.ids = torch.full((rows, 1), policy.pad_id, dtype=torch.long, device=device)
        self.pos = torch.zeros((rows, 1), dtype=torch.long, device=device)
        self.mask = torch.zeros((rows, 1, 1, positions), dtype=torch.bool, device=device)
        self.mask[:, :, :, 0] = True  # padding rows attend to one (zero) column: finite, and never read
        self.column = torch.full((1,), positions - 1, dtype=torch.long, device=device)
        self.cache = _StaticCache(
            [_StaticLayer(k, v, self.column) for k, v in zip(self.keys, self.values, strict=True)]
        )
        self._owner: tuple = (
            lambda: None,
            None,
        )  # (weakref to the batch cache whose layers view these, a view)
        self.graph = torch.cuda.CUDAGraph() if pool is not None else None
        self.logits = self._capture(policy, pool) if pool is not None else None

    def _forward(self, policy) -> torch.Tensor:
        return self.decoder.forward(policy.model, self.ids, self.mask, self.pos, self.cache)

    def _capture(self, policy, pool) -> torch.Tensor:
        # Warm-up runs on a side stream (cuBLAS handles, lazy kernel loading) write only the last column, which a
        # batch's mask hides until the step that writes it.
        side = torch.cuda.Stream(device=policy.device)
        side.wait_stream(torch.cuda.current_stream(policy.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(policy)
        torch.cuda.current_stream(policy.device).wait_stream(side)
        with torch.cuda.graph(self.graph, pool=pool):
            logits = self._forward(policy)
        return logits

    def adopt(self, cache, mask: torch.Tensor) -> None:
        """Copy ``cache`` (its ``mask [B, T]``) into the buffers and make its layers views of them."""
        B, T = mask.shape
        for layer, k, v in zip(cache.layers, self.keys, self.values, strict=True):
            k[:B, :, :T] = layer.keys
            v[:B, :, :T] = layer.values
            layer.adopt(k[:B], v[:B], T)
            layer.capacity = self.positions
        self.mask[:B] = False
        self.mask[:B, 0, 0, :T] = mask.bool()
        self.mask[B:] = False
        self.mask[B:, :, :, 0] = True
        self.pos[B:] = 0
        self._owner = (weakref.ref(cache), cache.layers[0]._k)

    def holds(self, cache) -> bool:
        """Whether ``cache``'s layers are views of these buffers now."""
        ref, view = self._owner
        return ref() is cache and cache.layers[0]._k is view

    @property
    def free(self) -> bool:
        """No live batch reads these buffers (its cache is gone, or was rebuilt into other tensors since)."""
        ref, view = self._owner
        cache = ref()
        return cache is None or cache.layers[0]._k is not view

    def step(self, batch, next_ids: torch.Tensor) -> torch.Tensor:
        """Run one decode step of ``batch`` (its mask and positions already advanced) through the graph."""
        B, T = batch.mask.shape
        self.ids[:B] = next_ids
        self.pos[:B] = batch.pos
        self.mask[:B, 0, 0, T - 1] = True  # the column this step writes: every row feeds a token
        self.column.fill_(T - 1)
        if self.graph is not None:
            self.graph.replay()
        else:  # uncaptured (no CUDA): the same static-shape forward, run eagerly
            self.logits = self._forward(self.policy)
        for layer in batch.cache.layers:
            layer.length = T
            layer._views()
        return self.logits[:B].clone()  # the next replay overwrites the static output


def _decode_forward(model, ids, mask, pos, cache) -> torch.Tensor:
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1, :]


class GraphDecoder:
    """The captured decode steps of one :class:`~memrl.policy.engine.hf.HFPolicy` (see the module docstring)."""

    def __init__(
        self, policy, max_graphs: int = MAX_GRAPHS, capture: bool = True, compile: bool = False
    ) -> None:
        """``capture=False`` runs the same static-shape steps eagerly: what a CPU test can check of them.
        ``compile``: the recorded forward is torch.compile's (fused kernels: fewer of them to replay), compiled
        once per bucket shape at its capture."""
        self.policy = policy
        self.forward = torch.compile(_decode_forward, dynamic=False) if compile else _decode_forward
        self.max_graphs = max_graphs
        self.graphs: OrderedDict[tuple, _Graph] = OrderedDict()  # least recently used first
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.captures = 0  # graphs captured (each costs two warm-up forwards and a capture)
        self.replays = 0
        self._lora: tuple[object, list] = (None, [])

    @staticmethod
    def supports(batch) -> bool:
        layers = batch.cache.layers
        return (
            bool(layers)
            and all(type(layer) is PreallocatedLayer for layer in layers)
            and _bucket_rows(len(batch.rows)) is not None
        )

    def step(self, batch, next_ids: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, V]`` of ``batch``'s decode step; ``next_ids`` ``[B, 1]`` are the tokens it feeds. Call it
        inside the policy's own forward context (the LoRA fold decides the recorded code)."""
        B, T = batch.mask.shape
        mode = self._mode()
        key = next((k for k, g in self.graphs.items() if k[2:-1] == mode and g.holds(batch.cache)), None)
        if key is None or key[1] < T or key[0] < B:
            remaining = max(r.budget - len(r.out) for r in batch.rows)
            key, graph = self._graph(_bucket_rows(B), _bucket_positions(T + max(remaining, 0)), mode, batch)
            # The step's own column is already in the batch's mask; its cache holds T - 1 positions until then.
            graph.adopt(batch.cache, batch.mask[:, : T - 1])
        self.graphs.move_to_end(key)
        self.replays += 1
        return self.graphs[key].step(batch, next_ids)

    def _graph(self, rows: int, positions: int, mode: tuple, batch) -> tuple[tuple, _Graph]:
        """A free graph of this shape and mode, captured if none is."""
        for slot in itertools.count():
            key = (rows, positions, *mode, slot)
            graph = self.graphs.get(key)
            if graph is None:
                break
            if graph.free:
                return key, graph
        while len(self.graphs) >= self.max_graphs:
            old = next((k for k, g in self.graphs.items() if g.free), None)
            if old is None:
                break
            del self.graphs[old]
        template = batch.cache.layers[0]
        graph = _Graph(self, rows, positions, template, len(batch.cache.layers))
        self.graphs[key] = graph
        self.captures += 1
        return key, graph

    def _mode(self) -> tuple:
        """What decides the code a forward runs: a graph records one of these."""
        model = self.policy.model
        if self._lora[0] is not model:
            self._lora = (model, lora_layers(model))
        lora = self._lora[1]
        merged = bool(lora) and bool(lora[0].merged)
        disabled = bool(lora) and bool(lora[0].disable_adapters)
        adapter = getattr(model, "active_adapter", None)
        dtype = next(model.parameters()).dtype
        return (
            id(model),
            adapter if isinstance(adapter, str) else None,
            merged,
            disabled,
            model.training,
            str(dtype),
        )
