"""Tree-local token advantages for tree-rollout leaves (TreeRL-style process credit from the tree itself).

Leaves of one tree share prefixes, so the tree gives a Monte-Carlo value for every node: ``V(n)`` = the mean
reward of the counted leaves below ``n`` (each leaf's ``StepMeta.tree_path`` lists its root-to-leaf nodes
with their response positions). The response tokens on the edge from node ``p`` to its child ``c`` (the
positions ``[pos(p), pos(c))``) were chosen before the tree knew more, and ``V(c) - V(p)`` is how much those
choices moved the expected reward; the tokens after a leaf's last node get ``r_leaf - V(last)``.

Added to the sequence advantage (GRPO etc.) as ``weight * (V(c) - V(p)) / (std_g + eps)``, with the group's
reward std (the scale GRPO divides by), so one unit of local credit is worth one unit of group-relative credit.
Only branch points carry local signal: an edge whose child has the same leaves as its parent has ``V(c) = V(p)``,
and the shared prefix of a tree whose leaves all scored alike gets 0. Rows without a tree path (chain samples,
history steps) get no local term. Duplicated leaves (weight 0) count in no value, as in the group statistics.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from itertools import pairwise

import torch

from memrl.train.advantages import group_stats
from memrl.types import StepMeta


def _path(meta: StepMeta) -> list[tuple[str, int]] | None:
    return [(node.uid, node.pos) for node in meta.tree_path] or None


def node_values(paths: Sequence[list[tuple[str, int]] | None], scores: torch.Tensor, weights: torch.Tensor):
    """``V(node uid)`` = mean score of the counted rows whose path passes through it."""
    sums: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for i, path in enumerate(paths):
        if path is None or weights[i] <= 0:
            continue
        for uid, _ in path:
            sums[uid] += float(scores[i])
            counts[uid] += 1
    return {uid: sums[uid] / counts[uid] for uid in sums}


def tree_local_advantages(
    step_meta: Sequence[StepMeta],
    scores: torch.Tensor,
    group_ids: Sequence[str],
    weights: torch.Tensor,
    response_lengths: Sequence[int],
    eps: float = 1e-6,
) -> list[torch.Tensor | None]:
    """Per row, the local advantage of each response token (``[R_i]`` float32), or ``None`` for a row that is
    no tree leaf. ``scores``/``weights`` are ``[B]`` as for :mod:`memrl.train.advantages`."""
    paths = [_path(m) for m in step_meta]
    values = node_values(paths, scores, weights)
    _, _, std, _ = group_stats(scores, group_ids, weights)
    out: list[torch.Tensor | None] = []
    for i, path in enumerate(paths):
        if path is None:
            out.append(None)
            continue
        R = int(response_lengths[i])
        if any(b[1] < a[1] for a, b in pairwise(path)) or path[-1][1] > R:
            raise ValueError(
                f"tree advantage: row {i}: tree_path positions must rise within the response "
                f"(length {R}), got {[pos for _, pos in path]}"
            )
        # Nodes at one position on a path hold the same tokens, so the same state: the shallowest one (most
        # leaves) values it. Past the last node the leaf's own score is the value.
        firsts = [
            (pos, uid) for k, (uid, pos) in enumerate(path) if pos < R and (k == 0 or path[k - 1][1] != pos)
        ]
        points = [(pos, values.get(uid, float(scores[i]))) for pos, uid in firsts] + [(R, float(scores[i]))]
        local = torch.zeros(R, dtype=torch.float32)
        for (start, before), (end, after) in pairwise(points):
            local[start:end] = (after - before) / (float(std[i]) + eps)
        out.append(local)
    return out
