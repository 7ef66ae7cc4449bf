"""The default backend: any transformers causal LM (optionally with a PEFT LoRA adapter), decoded by our own loop.

The loop runs ``model(...)`` over a KV cache with pre-allocated capacity (:mod:`memrl.policy.engine.kv_cache`) so that it
can report per-token logprobs and top-k alternatives, honour stop strings / stop ids per sequence and resume from
the states of cached prefixes (:mod:`memrl.policy.engine.radix_cache`: every finished row leaves its states there, and a
request continues from the longest cached prefix of its token ids). Not thread-safe: serialise calls (``memrl
serve`` does). LoRA adapters (loading, switching, folding) live in :mod:`memrl.policy.engine.adapters` and
scoring given responses in :mod:`memrl.policy.engine.score`; :class:`HFPolicy` hands its public methods for both
to them.

Batch layout (``B`` rows = requests x ``n``): row ``i`` reuses ``c_i`` cached prompt positions and computes the
``r_i`` remaining ones. The batch cache is ``[B, heads, C, head_dim]`` with ``C = max c_i``, each row's cached
states right-aligned (left-padded); the new tokens ``[B, R]`` are left-padded too, so a row's attention mask may
have a hole between its cached part and its new part. Position ids are ``cumsum(mask) - 1``, so every real token
sits at the position it would have without padding (RoPE keys stored in the cache stay valid).

>>> policy = HFPolicy(PolicyConfig(model="smollm2-135m"))
>>> [[out]] = policy.generate([GenerationRequest(prompt_ids=ids, params=SamplingParams(temperature=0))])
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

import torch

from memrl.policy.base import Capability, GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine import score
from memrl.policy.engine.adapters import LoraAdapters, module_digest
from memrl.policy.engine.architecture import check_servable, text_config
from memrl.policy.engine.batching import DecodeBatch, DecodeRow
from memrl.policy.engine.continuous import HFStream
from memrl.policy.engine.cuda_graphs import GraphDecoder
from memrl.policy.engine.kv_cache import (
    PreallocatedLayer,
    SharedPrefixCache,
    preallocated_cache,
    prefix_filled_cache,
    shared_prefix_cache,
)
from memrl.policy.engine.load import (
    attention_implementation,
    enable_shared_attention,
    eos_ids,
    load_model_and_tokenizer,
    model_max_len,
    pad_id,
)
from memrl.policy.engine.radix_cache import PrefixStates, RadixCache, shared_prefix_groups
from memrl.policy.engine.sampling import StopChecker, choose_tokens
from memrl.policy.engine.sliding_window import causal_bool_mask, positions_kwargs
from memrl.policy.engine.speculative import drafts_for, speculative_step
from memrl.policy.errors import PolicyError
from memrl.types import FinishReason, GenerationOutput

logger = logging.getLogger(__name__)


# Requests of one call whose prompts share at least this many leading tokens get that prefix computed once (see
# HFPolicy._share_prompts), when the radix cache does not hold it yet. Shorter common prefixes are mostly the
# template's opening instructions, shared by unrelated prompts: sharing them saves little and costs one more
# sequential forward before the real prefill, plus a copy of the cached state into every row's cache. A
# conversation slice shared by its questions (LoCoMo under recent_history) is far above it.
MIN_SHARED_PREFIX = 256
# On CPU, rows of different lengths are prefilled one by one (no padding, causal kernel) and then decoded together:
# a single prompt already keeps the matmuls busy, so padding is pure extra work. Short tails (tool results and fork
# points after a cached prefix) are cheaper in one padded forward than one forward per row, so one-by-one prefill
# starts where some row computes this many positions (docs/internals.md, Prefill). On an accelerator one padded
# batch fills the device: always batched there.
RAGGED_MIN_TOKENS = 64


def _needs_padding(rows: Sequence[DecodeRow], min_tail: int = 2) -> bool:
    """Whether one batched prefill of ``rows`` would pad enough to be worth avoiding: some row computes at least
    ``min_tail`` (>= 2) positions and the rows' (reused, computed) lengths differ."""
    if len(rows) < 2 or max(len(r.prompt) - r.cached for r in rows) < min_tail:
        return False
    return len({(r.cached, len(r.prompt)) for r in rows}) > 1


def _prefix_dominates(rows: Sequence[DecodeRow]) -> bool:
    """Whether the rows' cached prefix is at least as long as what any of them computes (tree branches of a node,
    the samples of a prompt): then reading it once per step beats padding-free prefill. A short incidental hit (a
    template's opening, shared by unrelated prompts) is not worth a padded prefill of long tails."""
    return min(r.cached for r in rows) >= max(len(r.prompt) - r.cached for r in rows)


class HFPolicy:
    """:class:`~memrl.policy.base.PolicyClient` over a transformers model, in process."""

    capabilities = frozenset(Capability)

    def __init__(self, cfg: PolicyConfig, model=None, tokenizer=None) -> None:
        self.cfg = cfg
        if model is None:
            model, tokenizer = load_model_and_tokenizer(cfg)
        elif tokenizer is None:
            raise PolicyError("HFPolicy: a model was given without its tokenizer")
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(cfg.device)
        # Every finished row leaves its states here; requests continue from their longest cached prefix.
        self.prefix_cache = RadixCache(cfg.prefix_cache_tokens)
        self._seed_source = torch.Generator().manual_seed(cfg.seed)
        self.pad_id = pad_id(tokenizer)
        self.eos_ids = eos_ids(model, tokenizer)
        self.max_model_len = min(cfg.max_model_len, model_max_len(model))
        # Rows that all continue from one cached prefix attend to one copy of it (see _shared_prefix).
        self.shared_attention = enable_shared_attention(model)
        self.bool_decode_mask = attention_implementation(model) in ("sdpa", "memrl_sdpa")
        # The window size where some layer attends through one (None: global attention only); refused at load
        # where the engine cannot serve it (memrl.policy.engine.architecture).
        self.sliding_window = check_servable(model, cfg.model, self.shared_attention)
        self.ragged_prefill = self.device.type == "cpu"  # see RAGGED_MIN_TOKENS
        self.ragged_min_tokens = RAGGED_MIN_TOKENS
        # Model forwards: calls, rows (sum of batch sizes), tokens fed, seconds (host time: exact on CPU, launch
        # time on an asynchronous device). Benchmarks split a speed-up into fewer forwards vs cheaper ones with it.
        self.forward_stats: Counter[str] = Counter()
        # LoRA weights, per-adapter prefix caches and the folded adapter (memrl.policy.engine.adapters).
        self.adapters = LoraAdapters(self)
        # Decode steps replayed from captured CUDA graphs (memrl.policy.engine.cuda_graphs).
        # Not for sliding-window models: a captured step's mask carries no window.
        self._graphs = (
            GraphDecoder(self, compile=cfg.compile_decode)
            if self.device.type == "cuda" and cfg.cuda_graphs and self.sliding_window is None
            else None
        )

    @classmethod
    def from_model(cls, model, tokenizer, cfg: PolicyConfig | None = None) -> HFPolicy:
        """Wrap an already loaded (possibly PEFT-wrapped, possibly shared with a trainer) model."""
        cfg = cfg or PolicyConfig(device=str(next(model.parameters()).device))
        return cls(cfg, model=model, tokenizer=tokenizer)

    # ------------------------------------------------------------------ weights (memrl.policy.engine.adapters)

    def load_adapter(self, path: str | Path) -> None:
        """Hot-swap LoRA weights from a PEFT adapter directory (attaching the adapter on first call)."""
        self.adapters.load(path)

    def set_adapter_state(self, weights: Mapping[str, torch.Tensor], adapter: str = "default") -> None:
        """Load in-memory LoRA weights (PEFT state-dict names, as ``get_peft_model_state_dict`` returns)."""
        self.adapters.set_state(weights, adapter)

    def invalidate_cache(self) -> None:
        """Forget cached prefix states; call after changing the model's weights in place."""
        self.prefix_cache.clear()
        self.adapters.weights_changed()

    def weights_digest(self, adapter: str) -> str | None:
        """Digest of the base and adapter ``adapter`` (the active one where the model has no such adapter)."""
        peft = getattr(self.model, "peft_config", None) or {}
        name = adapter if adapter in peft else (self.model.active_adapter if peft else None)
        return module_digest(self.model, name)

    def use_adapter(self, name: str) -> AbstractContextManager[None]:
        """Generate with LoRA adapter ``name`` inside the ``with`` block, from that adapter's own prefix cache."""
        return self.adapters.use(name)

    def _own_forward(self) -> AbstractContextManager[None]:
        """Around the policy's own forwards: the active LoRA adapter folded in where ``policy.merge_lora`` is on."""
        return self.adapters.own_forward()

    # ------------------------------------------------------------------ generation

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[GenerationOutput]]:
        """One batched call: the requests run on a fresh :meth:`stream` until every one has finished."""
        stream = self.stream()
        try:
            ids = stream.add(requests)
            done: dict[int, list[GenerationOutput]] = {}
            while len(done) < len(ids):
                finished = stream.wait()
                if not finished:
                    raise PolicyError(f"generate: {len(ids) - len(done)} requests never finished")
                done.update(finished)
            return [done[i] for i in ids]
        finally:
            stream.close()

    def stream(self):
        """A :class:`~memrl.policy.stream.GenerationStream`: requests join the running decode batch and each
        comes back as soon as its samples have finished."""
        return HFStream(self)

    def _share_prompts(self, requests: Sequence[GenerationRequest]) -> list[int | None]:
        """Compute prompt prefixes that several rows need once, as vLLM's prefix caching or SGLang's radix cache
        would serve them, instead of once per row: requests that share at least :data:`MIN_SHARED_PREFIX` leading
        tokens continue from their common prefix, and a request for ``n > 1`` samples from its ``prompt[:-1]``.
        Those the radix cache does not hold yet are computed by one nested :meth:`generate` call (one row per
        distinct prefix, which shares their own common prefixes in turn) and land in the cache, where the rows
        find them. Greedy outputs are those of unshared prefills.

        Returns, per request, the ``cached_tokens`` to report when this call computed part of its prefix (the
        cached length before the call: the shared part was computed for it), else ``None``."""
        reported: list[int | None] = [None] * len(requests)
        if self.prefix_cache.budget_tokens == 0:
            return reported  # nothing would be kept for the rows to find
        free = [i for i, r in enumerate(requests) if len(r.prompt_ids) > 2]
        starts: dict[int, tuple[int, ...]] = {}  # request index → the prefix its rows continue from
        for length, members in shared_prefix_groups(
            [requests[i].prompt_ids for i in free], MIN_SHARED_PREFIX
        ):
            for j in members:
                starts[free[j]] = requests[free[j]].prompt_ids[:length]
        for i in free:
            if requests[i].params.n > 1:
                starts[i] = requests[i].prompt_ids[:-1]
        cold: dict[tuple[int, ...], None] = {}
        for i, prefix in starts.items():
            if self.prefix_cache.match_length(prefix) < len(prefix):
                reported[i] = self.prefix_cache.match_length(requests[i].prompt_ids[:-1])
                cold[prefix] = None
        if cold:
            once = SamplingParams(temperature=0.0, max_tokens=1)
            self.generate([GenerationRequest(p, once) for p in cold])
        return reported

    def _rows_for(self, index: int, req: GenerationRequest, reported: int | None = None) -> list[DecodeRow]:
        """One row per sample, each continuing from the longest cached prefix of the prompt (at least one token
        is computed: its logits give the first new token), locked in the cache until the row is prefilled."""
        p = req.params
        match = self.prefix_cache.match(req.prompt_ids[:-1])
        cached = match.length if match is not None else 0
        budget = min(p.max_tokens, self.max_model_len - len(req.prompt_ids))
        base_seed = (
            p.seed if p.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._seed_source))
        )
        rows = []
        for s in range(p.n):
            row = DecodeRow(
                req=index,
                sample=s,
                prompt=req.prompt_ids,
                params=p,
                seed=(base_seed + s) & ((1 << 63) - 1),  # an int64 for counter_uniform
                stopper=StopChecker(self.tokenizer, p.stop, p.stop_token_ids, self.eos_ids),
                budget=budget,
                match=match,
                cached=cached,
                reported_cached=reported,
            )
            if budget < 1:
                logger.warning(
                    "request %d: prompt of %d tokens leaves no room in max_model_len=%d; aborted",
                    index,
                    len(req.prompt_ids),
                    self.max_model_len,
                )
                row.finish, row.match, row.cached = FinishReason.ABORT, None, 0
            elif match is not None:
                self.prefix_cache.lock(match)
                row.holds_lock = True
            rows.append(row)
        return rows

    def _release_rows(self, rows: Sequence[DecodeRow]) -> None:
        """Unlock the cached prefixes of rows that will not be prefilled (any more)."""
        for row in rows:
            if row.holds_lock and row.match is not None:
                self.prefix_cache.unlock(row.match)
                row.holds_lock = False

    @staticmethod
    def _read_prefixes(rows: Sequence[DecodeRow]) -> None:
        """Each row's cached states (``row.entry``), one copy per distinct prefix: rows continuing from the same
        cached prefix share it (and so may attend to one copy, see :meth:`_shared_prefix`)."""
        seen: dict[tuple[int, int], PrefixStates] = {}
        for row in rows:
            if row.match is not None and row.cached > 0:
                key = row.match.key
                if key not in seen:
                    seen[key] = row.match.states()
                row.entry = seen[key]

    def _start(self, rows: list[DecodeRow]) -> DecodeBatch:
        """Prefill ``rows``: a batch whose logits predict each row's first new token."""
        self._read_prefixes(rows)
        try:
            return self._prefill(rows)
        finally:
            self._release_rows(rows)
            for row in rows:
                row.entry = None  # the batch cache holds what the rows need

    def _prefill(self, rows: list[DecodeRow]) -> DecodeBatch:
        # Rows continuing from one long cached prefix (tree branches of a node) keep the shared-prefix path, where it
        # is read once per step; otherwise padded prefill is wasted work (see RAGGED_MIN_TOKENS).
        if (
            self.ragged_prefill
            and _needs_padding(rows, self.ragged_min_tokens)
            and not (self._shared_prefix(rows) and _prefix_dominates(rows))
        ):
            logits, mask, pos, cache = self._prefill_ragged(rows)
        else:
            input_ids, mask, pos, cache = self._prefill_inputs(rows)
            unpadded = bool(mask.all())
            logits = self._forward(input_ids, None if unpadded else mask, pos, cache, causal_tail=unpadded)
        # Decoding appends all-ones columns: whether any row is padded changes only when rows leave or join.
        return DecodeBatch(list(rows), logits, mask, pos[:, -1:], cache, padded=not bool(mask.all()))

    def _sample(self, batch: DecodeBatch, live: list[int]) -> list[int]:
        """Sample the next token of the ``live`` rows; returns the batch positions of those still running."""
        logits = batch.logits if len(live) == len(batch.rows) else batch.logits[live]
        rows = [batch.rows[b] for b in live]
        choices = choose_tokens(
            logits, [r.params for r in rows], [r.seed for r in rows], [len(r.out) for r in rows]
        )
        still = []
        for b, row, choice in zip(live, rows, choices, strict=True):
            row.out.append(choice.token)
            row.lps.append(choice.logprob)
            row.tops.append(choice.top)
            done, reason = row.stopper.check(row.out)
            if done:
                row.finish, row.stop_reason = FinishReason.STOP, reason
            elif len(row.out) >= row.budget:
                row.finish = FinishReason.LENGTH
            if row.finish is None:
                still.append(b)
            else:
                self._insert(row, batch.cache, b, batch.mask[b])
        return still

    def _step(self, batch: DecodeBatch) -> None:
        """Feed every row's last token (finished rows riding along too): one decode forward, which also checks
        the rows' drafted tokens where prompt lookup finds some (:mod:`memrl.policy.engine.speculative`)."""
        if self._speculates(batch):
            drafts = drafts_for(batch.rows, self.cfg.speculative_tokens)
            if drafts is not None:
                speculative_step(self, batch, drafts)
                return
        next_ids = torch.tensor([[r.out[-1]] for r in batch.rows], device=self.device)
        batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch.rows), 1)], dim=1)
        batch.pos = batch.pos + 1
        mask = None
        if batch.padded:
            # One query per row sees every cached position, so its 4-D mask is just the padding mask; handing it
            # over ready-made skips transformers' per-step mask construction, a large share of a CPU decode step.
            mask = batch.mask.bool()[:, None, None, :] if self.bool_decode_mask else batch.mask
        if self._graphs is not None and self._graphs.supports(batch):
            t0 = time.perf_counter()
            with self._own_forward():
                batch.logits = self._graphs.step(batch, next_ids)
            self._count(next_ids, t0)
            return
        # Speculative steps widen the batch by the most drafts any row kept, so its width can outgrow the capacity
        # its budgets asked for (a row that keeps fewer is left with masked columns).
        for layer in batch.cache.layers:
            layer.reserve(1)
        batch.logits = self._forward(next_ids, mask, batch.pos, batch.cache)

    def _speculates(self, batch: DecodeBatch) -> bool:
        """Whether this step may check drafts: on, not replayed from a CUDA graph, on a plain batch cache (rows
        attending to one shared prefix decode one token a step)."""
        return (
            self.cfg.speculative_tokens > 0
            and self.bool_decode_mask  # a boolean [B, 1, q, T] mask: sdpa (flash attention takes none)
            and not (self._graphs is not None and self._graphs.supports(batch))
            and all(type(layer) is PreallocatedLayer for layer in batch.cache.layers)
        )

    def forward_positions(self, input_ids, mask, pos, cache) -> torch.Tensor:
        """Logits ``[B, q, V]`` at every fed position (``input_ids [B, q]`` under the boolean ``mask
        [B, 1, q, T]``): a speculative step's check of its drafts. ``cache`` is extended in place."""
        extra = {"memrl_draft_check": True} if self.shared_attention else {}
        return self._model_logits(input_ids, mask, pos, cache, input_ids.shape[1], extra)

    def _forward(self, input_ids, mask, pos, cache, causal_tail: bool = False) -> torch.Tensor:
        """Last-position logits ``[B, V]``; ``cache`` is extended in place.

        ``mask`` is ``None`` when no row is padded (e.g. branches of one node), so attention runs its causal
        kernel instead of materialising and applying a ``[B, 1, q, k]`` mask; ``causal_tail``: no row is padded
        and each continues from a cached prefix (:meth:`causal_tail_kwargs`)."""
        extra = {"memrl_shared_prefix": cache.prefix} if isinstance(cache, SharedPrefixCache) else {}
        if causal_tail and not extra:
            extra = self.causal_tail_kwargs()
        return self._model_logits(input_ids, mask, pos, cache, 1, extra)[:, -1, :]

    def _model_logits(self, input_ids, mask, pos, cache, keep: int, extra: dict) -> torch.Tensor:
        """One counted forward of the policy's own (LoRA folded): the logits of the last ``keep`` positions."""
        if self.sliding_window is not None:
            if mask is not None and mask.dim() == 2:  # transformers would window it by column, holes included
                mask = causal_bool_mask(mask, input_ids.shape[1])
            extra = {**extra, **self.window_kwargs(mask, pos, cache)}
        t0 = time.perf_counter()
        with self._own_forward():
            out = self.model(
                input_ids=input_ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=keep,
                **extra,
            )
        self._count(input_ids, t0)
        return out.logits

    def _count(self, input_ids: torch.Tensor, t0: float) -> None:
        stats = self.forward_stats
        stats["calls"] += 1
        stats["rows"] += input_ids.shape[0]
        stats["tokens"] += input_ids.numel()
        stats["seconds"] += time.perf_counter() - t0

    def _prefill_inputs(self, rows: list[DecodeRow]):
        """Inputs for the first forward of a batch of newly started rows.

        Returns ``input_ids [B, R]``, ``mask [B, C + R]``, ``position_ids [B, R]`` and the batch cache holding
        each row's reused prefix (``[B, heads, C, head_dim]`` per layer, right-aligned).
        """
        B = len(rows)
        C = max(r.cached for r in rows)
        rest = [r.prompt[r.cached :] for r in rows]
        R = max(len(x) for x in rest)
        input_ids = torch.full((B, R), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, C + R), dtype=torch.long)
        for i, (row, tail) in enumerate(zip(rows, rest, strict=True)):
            input_ids[i, R - len(tail) :] = torch.tensor(tail)
            mask[i, C + R - len(tail) :] = 1
            mask[i, C - row.cached : C] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, C:]
        capacity = C + R + max(r.budget for r in rows)
        # One row reads its prefix once per step either way: the plain cache keeps the kernels' fast paths.
        shared = self._shared_prefix(rows) if C > 0 and B > 1 else None
        if shared:
            cache = shared_prefix_cache(*shared, capacity)  # the shared prefix is kept once
        elif C > 0:
            prefixes = [(r.entry, r.cached) for r in rows]
            cache = prefix_filled_cache(self._num_layers(), capacity, prefixes, C)
        else:
            cache = preallocated_cache(self._num_layers(), capacity)
        dev = self.device
        return input_ids.to(dev), mask.to(dev), pos.to(dev), cache

    def _prefill_ragged(self, rows: list[DecodeRow]):
        """Prefill every distinct ``(prompt, reused prefix)`` on its own, then lay the rows out for batched decode.

        Each prefill runs one unpadded row (causal kernel, no mask); rows that share a prompt and a prefix state
        (the ``n`` samples of a request) share its result. The batch cache holds each row's whole sequence
        right-aligned in ``[0, T)`` (``T`` = longest), so the decode steps see the usual left-padded layout.
        Returns first-token ``logits [B, V]``, ``mask [B, T]``, ``pos [B, 1]`` (last real position) and the cache.
        """
        done: dict[tuple, tuple[torch.Tensor, PrefixStates]] = {}
        per_row = []
        for r in rows:
            key = (r.prompt, id(r.entry), r.cached)
            if key not in done:
                done[key] = self._prefill_one(r)
            per_row.append(done[key])
        lengths = [len(r.prompt) for r in rows]
        T = max(lengths)
        capacity = T + max(r.budget for r in rows)
        cache = prefix_filled_cache(
            self._num_layers(), capacity, [(e, n) for (_, e), n in zip(per_row, lengths, strict=True)], T
        )
        lens = torch.tensor(lengths)[:, None]
        mask = (torch.arange(T)[None] >= T - lens).long()  # each row right-aligned
        pos = lens - 1
        logits = torch.cat([lg for lg, _ in per_row])
        return logits, mask.to(self.device), pos.to(self.device), cache

    def _prefill_one(self, row: DecodeRow) -> tuple[torch.Tensor, PrefixStates]:
        """One row's prompt through the model (reusing its cached prefix): last logits ``[1, V]`` and its states."""
        tail = row.prompt[row.cached :]
        n = len(row.prompt)
        if row.cached:
            cache = prefix_filled_cache(self._num_layers(), n, [(row.entry, row.cached)], row.cached)
        else:
            cache = preallocated_cache(self._num_layers(), n)
        ids = torch.tensor([tail], device=self.device)
        pos = torch.arange(row.cached, n, device=self.device)[None]
        logits = self._forward(ids, None, pos, cache, causal_tail=row.cached > 0)
        keys = [layer.keys[0] for layer in cache.layers]
        values = [layer.values[0] for layer in cache.layers]
        return logits, PrefixStates(keys=keys, values=values)

    def _shared_prefix(self, rows: list[DecodeRow]) -> tuple[PrefixStates, int] | None:
        """``(entry, length)`` when every row continues from the same cached prefix state (tree branches of a
        node, the samples of a prompt) and the model attends to one copy of it. Rows continuing from several
        states take per-row copies: on CPU one attention per state measured slower than fused sdpa over copies."""
        first = rows[0]
        if not self.shared_attention or first.entry is None or first.cached == 0:
            return None
        if any(r.entry is not first.entry or r.cached != first.cached for r in rows):
            return None
        return first.entry, first.cached

    def _insert(self, row: DecodeRow, cache, batch_index: int, row_mask: torch.Tensor) -> None:
        """Leave the finished row's states in the radix cache (only the positions it does not hold yet are
        copied out of the batch cache).

        The cache holds ``prompt + out[:-1]`` (the last sampled token was never fed); ``row_mask`` marks which of
        its positions are real for this row."""
        if self.prefix_cache.budget_tokens == 0:
            return
        real = row_mask.bool()

        def take(start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
            states = [layer.row_states(batch_index, real, start) for layer in cache.layers]
            return [k for k, _ in states], [v for _, v in states]

        self.prefix_cache.insert(row.prompt + tuple(row.out[:-1]), take)

    def window_kwargs(self, mask, pos: torch.Tensor, cache) -> dict:
        """Forward kwargs that let sliding-window layers mask by position (:mod:`memrl.policy.engine.sliding_window`):
        for queries at ``pos [B, q]`` appended to ``cache`` under ``mask`` (as :func:`key_positions` reads it);
        none for a model without a window."""
        if self.sliding_window is None:
            return {}
        return positions_kwargs(mask, pos, cache.get_seq_length() + pos.shape[1])

    def causal_tail_kwargs(self) -> dict[str, bool]:
        """Forward kwargs for unpadded rows that continue from a cached prefix: on CPU, attention computes the
        prefix and the rows' own causal square apart (:func:`memrl.policy.engine.shared_attention.causal_tail_attention`)
        instead of one masked kernel over all of it."""
        return {"memrl_causal_tail": True} if self.shared_attention and self.device.type == "cpu" else {}

    def _num_layers(self) -> int:
        return int(text_config(self.model.config).num_hidden_layers)

    # ------------------------------------------------------------------ scoring (memrl.policy.engine.score)

    def logprobs(
        self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], *, temperature: float = 1.0
    ) -> list[list[float]]:
        """log p(response_i | prompt, response_<i) under ``logits / temperature`` for each pair."""
        return score.logprobs(self, sequences, temperature)

    def greedy_logprobs(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[score.Scored]:
        """Per (prompt, response): log p of each response token, the argmax token at each of its positions and
        that token's log p (:func:`memrl.policy.engine.score.greedy_logprobs`)."""
        return score.greedy_logprobs(self, sequences)
