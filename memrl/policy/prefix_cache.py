"""Kept prefix states (KV caches) for the HF backend, addressed by opaque handles.

A handle covers ``tokens`` (prompt + output of the generation that kept it) and stores the key/value states of
the first ``kv_len`` of them (the last sampled token was never fed to the model). A later request may reuse the
longest common prefix of the handle's tokens and its own prompt: branching mid-sequence just crops the cache.
Handles are a speed hint, never a correctness requirement: an evicted or unknown-but-evicted handle falls back to
full recompute (``cached_tokens = 0``); an unknown handle that was never issued is an error.
"""

from __future__ import annotations

import itertools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from memrl.policy.errors import PolicyError

logger = logging.getLogger(__name__)


@dataclass
class PrefixEntry:
    """``keys[l]`` / ``values[l]``: ``[heads, kv_len, head_dim]`` for layer ``l``."""

    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def kv_len(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0


# Tokens compared per slice in common_prefix_len: equal blocks are skipped by one C-level comparison each, since
# prompts of one conversation share thousands of tokens and a Python loop costs ~1 ms per thousand.
_BLOCK = 64


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i + _BLOCK <= n and a[i : i + _BLOCK] == b[i : i + _BLOCK]:
        i += _BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shared_prefix_groups(prompts: Sequence[Sequence[int]], min_len: int) -> list[tuple[int, list[int]]]:
    """Groups of at least two of ``prompts`` (their indices, in sorted order) that share their first
    ``length >= min_len`` tokens, as ``(length, indices)``; ``length`` leaves every member at least one token of
    its own (generation starts from a computed last position). Prompts in no group are left out.

    Sorted, prompts with a long common prefix are neighbours, and the common prefix of a sorted run is the
    shortest of its neighbours' common prefixes; a group is a maximal run whose neighbours share ``min_len``."""
    runs: list[tuple[int, list[int]]] = []  # (common prefix so far, members)
    for i in sorted(range(len(prompts)), key=lambda i: tuple(prompts[i])):
        if runs:
            shared, run = runs[-1]
            lcp = common_prefix_len(prompts[run[-1]], prompts[i])
            if lcp >= min_len:
                run.append(i)
                runs[-1] = (min(shared, lcp), run)
                continue
        runs.append((len(prompts[i]), [i]))
    out = []
    for shared, run in runs:
        length = min(shared, min(len(prompts[i]) for i in run) - 1)
        if len(run) > 1 and length >= min_len:
            out.append((length, run))
    return out


class PrefixCache:
    """LRU store of :class:`PrefixEntry` bounded by ``budget_tokens`` cached positions in total."""

    def __init__(self, budget_tokens: int) -> None:
        self.budget_tokens = budget_tokens
        self._entries: OrderedDict[str, PrefixEntry] = OrderedDict()
        self._issued: set[str] = set()
        self._counter = itertools.count()
        self.evictions = 0
        self.pinned: set[str] = set()  # never evicted for budget (the backend's recent shared prefixes)
        # Running sum of the entries' kv_len: put runs per kept row, often with thousands of entries.
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def cached_tokens(self) -> int:
        return self._tokens

    def put(self, entry: PrefixEntry) -> str:
        handle = f"kv-{next(self._counter)}"
        self._issued.add(handle)
        if entry.kv_len > self.budget_tokens:
            logger.debug(
                "prefix of %d tokens exceeds the cache budget; handle %s will recompute", entry.kv_len, handle
            )
            return handle
        self._entries[handle] = entry
        self._tokens += entry.kv_len
        while self._tokens > self.budget_tokens:
            old = next((h for h in self._entries if h not in self.pinned and h != handle), None)
            if old is None:  # only pinned states (and the new one) left: they stay over budget
                break
            self._tokens -= self._entries.pop(old).kv_len
            self.evictions += 1
            logger.debug("evicted prefix handle %s (budget %d tokens)", old, self.budget_tokens)
        return handle

    def lookup(self, handle: str, prompt: Sequence[int]) -> tuple[PrefixEntry | None, int]:
        """The entry and how many leading prompt tokens it can serve (always leaving >= 1 token to compute)."""
        if handle not in self._issued:
            raise PolicyError(f"unknown prefix_handle {handle!r}: it was never returned by this backend")
        entry = self._entries.get(handle)
        if entry is None:
            return None, 0
        self._entries.move_to_end(handle)
        usable = min(common_prefix_len(entry.tokens, prompt), entry.kv_len, len(prompt) - 1)
        return entry, max(usable, 0)

    def alive(self, handle: str) -> bool:
        """Whether ``handle``'s state is still held (not evicted or released)."""
        return handle in self._entries

    def release(self, handles: Sequence[str]) -> None:
        for h in handles:
            self.pinned.discard(h)
            gone = self._entries.pop(h, None)
            if gone is not None:
                self._tokens -= gone.kv_len

    def clear(self) -> None:
        """Drop every state (after a weight update the cached keys/values are stale). Handles stay valid names."""
        self._entries.clear()
        self.pinned.clear()
        self._tokens = 0
