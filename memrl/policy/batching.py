"""Continuous batching state for the HF decode loop (:meth:`memrl.policy.hf.HFPolicy._decode`): the running batch,
how it sheds finished rows and merges newly prefilled ones, and when waiting rows are admitted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache

from memrl.policy.kv_cache import concat_batches

# Finished rows leave a decode batch once at most this share of it is still running: each exit copies the KV
# cache, so finished rows ride along (outputs ignored) until a quarter of the batch is done.
COMPACT_AT = 0.75


@dataclass(eq=False)
class DecodeBatch:
    """Rows decoding together: ``rows[b]`` is batch position ``b``; ``logits [B, V]`` predict each row's next
    token; ``mask [B, T]`` and the cache (``T`` positions) hold what was fed; ``pos [B, 1]`` is each row's last
    fed position. ``padded``: some row has masked positions (else attention runs its causal kernel)."""

    rows: list[Any]  # hf._Row: needs .budget and .out
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
