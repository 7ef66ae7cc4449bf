"""PrefixCache: LRU eviction by cached positions, with the running token count kept exact."""

from __future__ import annotations

import pytest
import torch

from memrl.policy.errors import PolicyError
from memrl.policy.prefix_cache import PrefixCache, PrefixEntry


def _entry(n: int) -> PrefixEntry:
    return PrefixEntry(tuple(range(n)), [torch.zeros(1, n, 2)], [torch.zeros(1, n, 2)])


def test_budget_evicts_least_recently_used_and_counts_stay_exact():
    cache = PrefixCache(budget_tokens=10)
    a, b = cache.put(_entry(4)), cache.put(_entry(5))
    assert cache.cached_tokens == 9
    cache.lookup(a, tuple(range(6)))  # a is now the most recently used
    c = cache.put(_entry(3))  # 12 > 10: b (least recent) goes
    assert cache.evictions == 1 and cache.cached_tokens == 7
    assert cache.lookup(b, (0, 1, 2)) == (None, 0) and cache.lookup(a, (0, 1, 2))[1] == 2
    cache.release([a, a, "kv-unknown"])  # a repeated or unknown handle releases nothing more
    assert cache.cached_tokens == 3 and len(cache) == 1
    big = cache.put(_entry(11))  # larger than the whole budget: never stored, the handle recomputes
    assert cache.cached_tokens == 3 and cache.lookup(big, (0, 1)) == (None, 0)
    cache.clear()
    assert cache.cached_tokens == 0 and cache.lookup(c, (0, 1)) == (None, 0)
    with pytest.raises(PolicyError, match="never returned"):
        cache.lookup("kv-999", (0,))
