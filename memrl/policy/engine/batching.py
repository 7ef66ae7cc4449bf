"""Continuous batching for the HF backend (:class:`DecodeLoop`, behind ``HFPolicy.generate`` and
``HFPolicy.stream``): the running batch, how it sheds finished rows and merges newly prefilled ones, and when
waiting rows are admitted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from transformers.cache_utils import DynamicCache

from memrl.policy.base import SamplingParams
from memrl.policy.engine.kv_cache import PreallocatedLayer, concat_batches, first_used
from memrl.policy.engine.radix_cache import PrefixMatch, PrefixStates
from memrl.policy.engine.sampling import StopChecker
from memrl.types import FinishReason, GenerationOutput

# Finished rows leave a decode batch once at most this share of it is still running: each exit copies the KV
# cache, so finished rows ride along (outputs ignored) until a quarter of the batch is done.
COMPACT_AT = 0.75


@dataclass
class DecodeRow:
    """One sequence being decoded (request ``req``, sample ``sample``) and what it has generated so far."""

    req: int
    sample: int
    prompt: tuple[int, ...]
    params: SamplingParams
    seed: int  # the row's sampling stream: token n uses counter_uniform(seed, n)
    stopper: StopChecker
    budget: int  # new tokens allowed (max_tokens clipped to the context window)
    match: PrefixMatch | None = None  # its cached prefix; locked in the cache until the row is prefilled
    cached: int = 0
    entry: PrefixStates | None = None  # the match's states, read at prefill (rows with one match share them)
    holds_lock: bool = False
    out: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    tops: list[dict[int, float]] = field(default_factory=list)
    finish: FinishReason | None = None
    stop_reason: str | int | None = None
    reported_cached: int | None = None  # cached_tokens to report when it differs from ``cached``

    def to_output(self) -> GenerationOutput:
        return GenerationOutput(
            token_ids=tuple(self.out),
            logprobs=tuple(self.lps),
            finish_reason=self.finish or FinishReason.ABORT,
            top_logprobs=tuple(self.tops) if self.params.top_logprobs > 0 else (),
            stop_reason=self.stop_reason,
            prompt_token_ids=self.prompt,
            cached_tokens=self.cached if self.reported_cached is None else self.reported_cached,
        )


@dataclass(eq=False)
class DecodeBatch:
    """Rows decoding together: ``rows[b]`` is batch position ``b``; ``logits [B, V]`` predict each row's next
    token; ``mask [B, T]`` and the cache (``T`` positions) hold what was fed; ``pos [B, 1]`` is each row's last
    fed position. ``padded``: some row has masked positions (else attention runs its causal kernel)."""

    rows: list[DecodeRow]
    logits: torch.Tensor
    mask: torch.Tensor
    pos: torch.Tensor
    cache: DynamicCache
    padded: bool

    def select(self, keep: list[int]) -> None:
        """Keep batch positions ``keep`` (in order); copies the cache."""
        if len(keep) == len(self.rows):
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.cache.batch_select_indices(idx)
        self.rows = [self.rows[b] for b in keep]
        self.logits, self.mask, self.pos = self.logits[idx], self.mask[idx], self.pos[idx]
        lead = first_used(self.mask)
        if lead and all(type(layer) is PreallocatedLayer for layer in self.cache.layers):
            # The rows that left were the only ones using these columns (see concat_batches).
            for layer in self.cache.layers:
                layer.drop_leading(lead)
            self.mask = self.mask[:, lead:]
        self.padded = self.padded and not bool(self.mask.all())

    def merge(self, keep: list[int], new: DecodeBatch) -> DecodeBatch:
        """This batch's rows at positions ``keep`` followed by ``new``'s, in one cache with room for every row's
        remaining budget (finished rows are dropped by the same copy, not by a :meth:`select` first)."""
        idx = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        rows = [self.rows[b] for b in keep] + new.rows
        T = max(self.mask.shape[1], new.mask.shape[1])
        capacity = T + max(r.budget - len(r.out) for r in rows)
        cache, mask = concat_batches([(self.cache, self.mask, idx), (new.cache, new.mask, None)], capacity)
        logits = torch.cat([self.logits[idx], new.logits])
        pos = torch.cat([self.pos[idx], new.pos])
        return DecodeBatch(rows, logits, mask, pos, cache, padded=not bool(mask.all()))


def admissible(limit: int, running: int, waiting: int) -> int:
    """How many waiting rows join a batch of ``running`` rows now: all that fit once a quarter of the batch is
    free (or all that wait, if fewer), since every admission copies the running cache."""
    free = min(limit - running, waiting)
    if free <= 0:
        return 0
    return free if free == waiting or free >= max(1, round(limit * (1 - COMPACT_AT))) else 0


class DecodeBackend(Protocol):
    """The three model-facing operations a :class:`DecodeLoop` schedules (:class:`memrl.policy.engine.hf.HFPolicy`)."""

    def _start(
        self, rows: list[DecodeRow]
    ) -> DecodeBatch: ...  # prefill: logits predict each row's first token

    def _sample(self, batch: DecodeBatch, live: list[int]) -> list[int]: ...  # returns rows still running

    def _step(self, batch: DecodeBatch) -> None: ...  # one decode forward of every row


class DecodeLoop:
    """Continuous batching over a queue that may grow while it runs (see :class:`memrl.policy.stream`).

    At most ``limit`` rows decode together; once enough have finished, waiting rows are prefilled and merged
    into the running batch, as vLLM schedules, instead of a fixed sub-batch idling while its longest row
    finishes. Between :meth:`run` calls the running batch is kept with fresh logits, so rows :meth:`add`-ed
    meanwhile join it at the next admission."""

    def __init__(self, backend: DecodeBackend, limit: int) -> None:
        self.backend = backend
        self.limit = limit
        self.batch: DecodeBatch | None = None
        self.live: list[int] = []  # batch positions of unfinished rows
        self.waiting: list[DecodeRow] = []

    def add(self, rows: Sequence[DecodeRow]) -> None:
        self.waiting.extend(rows)

    @property
    def busy(self) -> bool:
        return self.batch is not None or bool(self.waiting)

    def run(
        self,
        pause: Callable[[list[DecodeRow]], bool] | None = None,
        observe: Callable[[], None] | None = None,
    ) -> None:
        """Decode until every row has finished, or until a step finishes rows and ``pause(those rows)`` says to
        stop there (the batch then waits, with fresh logits, for the next call). ``observe()`` runs after every
        step (a server streams the rows' new tokens from there)."""
        while self.busy:
            if self.batch is None:
                self.batch = self.backend._start(self.waiting[: self.limit])
                self.waiting = self.waiting[self.limit :]
                self.live = list(range(len(self.batch.rows)))
            done = self._advance()
            if observe is not None:
                observe()
            if done and pause is not None and pause(done):
                return

    def _advance(self) -> list[DecodeRow]:
        """Sample one token for every live row, shed or admit rows, feed the next step; the rows that ended."""
        batch = self.batch
        assert batch is not None
        still = self.backend._sample(batch, self.live)
        kept = set(still)
        done = [batch.rows[b] for b in self.live if b not in kept]
        admit = admissible(self.limit, len(still), len(self.waiting))
        if not still and not admit:  # nothing runs and nothing waits (admissible admits into a free batch)
            self.batch, self.live = None, []
            return done
        # Dropping finished rows copies the whole cache, so it waits until a quarter of the rows are done (or new
        # rows join: the merge drops them in its own copy); until then they ride along, outputs ignored.
        if still and not admit and len(still) <= COMPACT_AT * len(batch.rows):
            batch.select(still)
            still = list(range(len(still)))
        if still:
            self.backend._step(batch)
        self.live = still
        if admit:
            new = self.backend._start(self.waiting[:admit])
            self.waiting = self.waiting[admit:]
            self.batch = batch.merge(still, new) if still else new
            self.live = list(range(len(self.batch.rows)))
        return done
