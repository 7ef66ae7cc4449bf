"""A radix tree (token trie) of key/value states for the HF backend, as SGLang's radix cache keeps them.

Each node holds the states of the tokens on its edge (``keys[l]`` / ``values[l]``: ``[heads, len(tokens),
head_dim]`` for layer ``l``); the path from the root spells a token prefix whose states are the concatenation of
its nodes'. A request's longest cached prefix is found by walking the trie with its token ids (a match may end
inside an edge: a tree fork at token t uses its parent's states cropped there). Finished rows insert what they
computed; an insertion that diverges inside an edge splits it.

Memory bound: at most ``budget_tokens`` positions in total. An insertion that goes over it evicts the least
recently used leaves that no waiting row holds (:meth:`RadixCache.lock`), then their parents as they become
leaves. Every lookup and insertion touches its whole path, so a shared prefix outlives the branches below it.

States are immutable once stored: a split copies both halves, so a :class:`PrefixMatch` taken earlier keeps
reading the tensors it was given.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

# Tokens compared per slice in common_prefix_len: equal blocks are skipped by one C-level comparison each, since
# prompts of one conversation share thousands of tokens, too many for a Python loop.
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


# take(start, end) -> (keys, values): one tensor per layer, [heads, end - start, head_dim], the states of the
# inserted sequence's positions [start, end), already copied out of whatever buffer held them.
StateSource = Callable[[int, int], tuple[list[torch.Tensor], list[torch.Tensor]]]


@dataclass(eq=False)
class RadixNode:
    tokens: tuple[int, ...]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    parent: RadixNode | None
    children: dict[int, RadixNode] = field(default_factory=dict)
    locks: int = 0  # waiting rows that will read this node's states (or a descendant's)
    last_used: int = 0


@dataclass
class PrefixStates:
    """``keys[l]`` / ``values[l]``: ``[heads, length, head_dim]``, the states of a prefix at layer ``l``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]


@dataclass(eq=False)
class PrefixMatch:
    """The cached states of a sequence's first ``length`` tokens: ``segments`` are the path's node states in
    order (the last one possibly used only in part); ``node`` is the deepest node (locks are taken there)."""

    length: int
    node: RadixNode
    segments: list[tuple[list[torch.Tensor], list[torch.Tensor]]]
    _states: PrefixStates | None = None

    @property
    def key(self) -> tuple[int, int]:
        """Equal for matches that read the same states (rows that can share one copy of them)."""
        return id(self.node), self.length

    def states(self) -> PrefixStates:
        """The prefix's states, one tensor per layer (views when the path is one node, else one copy)."""
        if self._states is None:
            layers = len(self.segments[0][0])
            keys, values, left = [[] for _ in range(layers)], [[] for _ in range(layers)], self.length
            for ks, vs in self.segments:
                n = min(left, ks[0].shape[-2])
                for li in range(layers):
                    keys[li].append(ks[li][:, :n])
                    values[li].append(vs[li][:, :n])
                left -= n
            join = (
                (lambda parts: parts[0]) if len(self.segments) == 1 else (lambda parts: torch.cat(parts, 1))
            )
            self._states = PrefixStates([join(k) for k in keys], [join(v) for v in values])
        return self._states


class RadixCache:
    """Token-trie KV store bounded by ``budget_tokens`` positions (0 = keep nothing)."""

    def __init__(self, budget_tokens: int) -> None:
        self.budget_tokens = budget_tokens
        self.root = RadixNode(tokens=(), keys=[], values=[], parent=None)
        self.tokens = 0  # positions held, summed over nodes
        self.evictions = 0  # nodes evicted for the budget
        self._clock = itertools.count(1)

    def __len__(self) -> int:
        """Nodes held (the root excluded)."""
        return sum(1 for _ in self._nodes())

    # ------------------------------------------------------------------ lookup

    def match(self, tokens: Sequence[int]) -> PrefixMatch | None:
        """The longest cached prefix of ``tokens`` (``None`` when nothing is cached); touches its path."""
        node, length, segments = self.root, 0, []
        now = next(self._clock)
        while length < len(tokens):
            child = node.children.get(tokens[length])
            if child is None:
                break
            n = common_prefix_len(child.tokens, tokens[length : length + len(child.tokens)])
            child.last_used = now
            segments.append((child.keys, child.values))
            node, length = child, length + n
            if n < len(child.tokens):
                break
        return PrefixMatch(length, node, segments) if length else None

    def match_length(self, tokens: Sequence[int]) -> int:
        found = self.match(tokens)
        return found.length if found is not None else 0

    # ------------------------------------------------------------------ insertion and eviction

    def insert(self, tokens: Sequence[int], take: StateSource) -> None:
        """Store the states of ``tokens``; ``take`` is asked only for the positions not cached yet."""
        if self.budget_tokens == 0 or not tokens:
            return
        tokens = tuple(tokens)
        node, length = self.root, 0
        now = next(self._clock)
        while length < len(tokens):
            child = node.children.get(tokens[length])
            if child is None:
                break
            n = common_prefix_len(child.tokens, tokens[length : length + len(child.tokens)])
            if n < len(child.tokens):
                child = self._split(child, n)
            child.last_used = now
            node, length = child, length + n
        if length < len(tokens):
            keys, values = take(length, len(tokens))
            if keys[0].shape[-2] != len(tokens) - length:
                raise ValueError(
                    f"RadixCache.insert: states of {keys[0].shape[-2]} positions for {len(tokens) - length} tokens"
                )
            leaf = RadixNode(tokens[length:], keys, values, parent=node, last_used=now)
            node.children[tokens[length]] = leaf
            self.tokens += len(leaf.tokens)
        self._evict()

    def _split(self, node: RadixNode, n: int) -> RadixNode:
        """Cut ``node``'s edge after ``n`` tokens: a new parent holds the first ``n``; returns it. Both halves are
        copied so that each frees its own memory when evicted."""
        assert node.parent is not None and 0 < n < len(node.tokens)
        head = RadixNode(
            tokens=node.tokens[:n],
            keys=[k[:, :n].clone() for k in node.keys],
            values=[v[:, :n].clone() for v in node.values],
            parent=node.parent,
            locks=node.locks,  # whoever holds the node holds its whole path
            last_used=node.last_used,
        )
        node.parent.children[node.tokens[0]] = head
        node.tokens = node.tokens[n:]
        node.keys = [k[:, n:].clone() for k in node.keys]
        node.values = [v[:, n:].clone() for v in node.values]
        node.parent = head
        head.children[node.tokens[0]] = node
        return head

    def _evict(self) -> None:
        if self.tokens <= self.budget_tokens:
            return
        leaves = [(n.last_used, id(n), n) for n in self._nodes() if not n.children and n.locks == 0]
        heapq.heapify(leaves)
        while self.tokens > self.budget_tokens and leaves:
            _, _, node = heapq.heappop(leaves)
            parent = node.parent
            assert parent is not None
            del parent.children[node.tokens[0]]
            self.tokens -= len(node.tokens)
            self.evictions += 1
            if parent is not self.root and not parent.children and parent.locks == 0:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))

    # ------------------------------------------------------------------ locks

    def lock(self, match: PrefixMatch) -> None:
        """Keep ``match``'s path from eviction until :meth:`unlock` (a row waiting to be prefilled reads it)."""
        node: RadixNode | None = match.node
        while node is not None and node is not self.root:
            node.locks += 1
            node = node.parent

    def unlock(self, match: PrefixMatch) -> None:
        node: RadixNode | None = match.node
        while node is not None and node is not self.root:
            node.locks -= 1
            node = node.parent

    def clear(self) -> None:
        """Drop every state (after a weight update the cached keys/values are stale)."""
        self.root = RadixNode(tokens=(), keys=[], values=[], parent=None)
        self.tokens = 0

    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
