"""RadixCache: longest-prefix lookup (also inside an edge), insertion that splits edges, LRU eviction of
unlocked leaves under the token budget, and states that stay exactly the ones inserted."""

from __future__ import annotations

import pytest
import torch

from memrl.policy.engine.radix_cache import RadixCache, common_prefix_len, shared_prefix_groups


def _states(tokens):
    """States that name their own token: position i's key is token i (so a read shows which states came back)."""

    def take(start: int, end: int):
        k = torch.tensor(tokens[start:end], dtype=torch.float32)[None, :, None]  # [heads=1, n, dim=1]
        return [k, k + 0.5], [-k, -k - 0.5]  # two layers

    return take


def _insert(cache: RadixCache, tokens) -> list[tuple[int, int]]:
    asked = []
    take = _states(tokens)

    def recording(start, end):
        asked.append((start, end))
        return take(start, end)

    cache.insert(tokens, recording)
    return asked


def _read(match) -> list[int]:
    return [int(x) for x in match.states().keys[0][0, :, 0]]


def test_lookup_returns_the_longest_cached_prefix_even_inside_an_edge():
    cache = RadixCache(budget_tokens=100)
    assert cache.match((1, 2, 3)) is None
    _insert(cache, (1, 2, 3, 4, 5))
    m = cache.match((1, 2, 3, 9))
    assert m.length == 3 and _read(m) == [1, 2, 3]  # a fork at token 3 reads its parent's states cropped
    assert cache.match((1, 2, 3, 4, 5, 6)).length == 5
    assert cache.match((7, 1)) is None
    states = cache.match((1, 2, 3, 4)).states()
    assert torch.equal(states.values[1][0, :, 0], -torch.tensor([1.0, 2, 3, 4]) - 0.5)  # every layer, k and v


def test_insert_splits_an_edge_and_asks_only_for_states_not_cached():
    cache = RadixCache(budget_tokens=100)
    assert _insert(cache, (1, 2, 3, 4, 5)) == [(0, 5)]
    assert _insert(cache, (1, 2, 3, 7, 8)) == [(3, 5)]  # the shared 3 tokens are not copied again
    assert _insert(cache, (1, 2, 3)) == []  # already held (an inner node now)
    assert cache.tokens == 7 and len(cache) == 3  # (1,2,3) -> (4,5) | (7,8)
    assert _read(cache.match((1, 2, 3, 4, 5, 0))) == [1, 2, 3, 4, 5]
    assert _read(cache.match((1, 2, 3, 7, 8, 0))) == [1, 2, 3, 7, 8]
    with pytest.raises(ValueError, match="states of 1 positions for 2 tokens"):
        cache.insert((9, 9), lambda s, e: ([torch.zeros(1, 1, 1)], [torch.zeros(1, 1, 1)]))


def test_a_match_taken_before_a_split_keeps_reading_its_states():
    cache = RadixCache(budget_tokens=100)
    _insert(cache, (1, 2, 3, 4, 5))
    before = cache.match((1, 2, 3, 4, 5, 6))
    _insert(cache, (1, 2, 9))  # splits the node the match read
    assert _read(before) == [1, 2, 3, 4, 5]


def test_budget_evicts_least_recently_used_leaves_first_and_counts_stay_exact():
    cache = RadixCache(budget_tokens=10)
    _insert(cache, (1, 2, 3, 4))
    _insert(cache, (5, 6, 7, 8, 9))
    cache.match((1, 2, 3, 4))  # now the most recently used
    _insert(cache, (20, 21, 22))  # 12 > 10: (5..9), the least recent, goes
    assert cache.tokens == 7 and cache.evictions == 1
    assert cache.match((5, 6, 7)) is None and cache.match((1, 2, 3, 4)).length == 4
    _insert(cache, tuple(range(30, 41)))  # larger than the whole budget: stored, then evicted (it is alone)
    assert cache.tokens <= 10


def test_eviction_takes_children_before_their_shared_prefix():
    cache = RadixCache(budget_tokens=9)
    _insert(cache, (1, 2, 3, 4, 5))
    _insert(cache, (1, 2, 3, 6, 7))  # (1,2,3) -> (4,5) | (6,7): 7 tokens
    _insert(cache, (8, 9, 10))  # 10 > 9: the oldest leaf (4,5) goes, the shared prefix stays
    assert cache.tokens == 8
    assert cache.match((1, 2, 3, 6, 7)).length == 5 and cache.match((1, 2, 3, 4)).length == 3


def test_eviction_never_drops_a_locked_state():
    cache = RadixCache(budget_tokens=6)
    _insert(cache, (1, 2, 3, 4))
    held = cache.match((1, 2, 3, 4, 0))
    cache.lock(held)  # a row waits to be prefilled from it
    _insert(cache, (5, 6, 7, 8))  # over budget: only the unlocked newcomer can go
    assert cache.match((1, 2, 3, 4)).length == 4 and cache.match((5, 6)) is None
    _insert(cache, (1, 2, 9))  # a split of a locked node keeps the lock on the new parent
    _insert(cache, (11, 12, 13, 14))
    assert cache.match((1, 2, 3, 4)).length == 4
    cache.unlock(held)
    _insert(cache, (21, 22, 23, 24, 25))
    assert cache.match((1, 2, 3, 4)) is None and cache.tokens <= 6


def test_a_zero_budget_keeps_nothing_and_clear_forgets_everything():
    off = RadixCache(budget_tokens=0)
    assert _insert(off, (1, 2, 3)) == [] and off.match((1, 2, 3)) is None
    cache = RadixCache(budget_tokens=100)
    _insert(cache, (1, 2, 3))
    cache.clear()
    assert cache.tokens == 0 and cache.match((1, 2, 3)) is None


def test_common_prefix_len_and_groups():
    a = tuple(range(200))
    assert common_prefix_len(a, a[:150] + (-1,)) == 150
    assert common_prefix_len(a, a) == 200 and common_prefix_len((), a) == 0
    prompts = [a + (1,), a + (2,), (5,) * 300, a[:10]]
    assert shared_prefix_groups(prompts, 100) == [(200, [0, 1])]
