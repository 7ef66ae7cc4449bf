"""Where a policy-written UPDATE lands: ``memory.update_target`` and ``memory.update_floor``.

The writer names the fact an UPDATE supersedes by a shown id, and SmolLM2-135M gets the id wrong more often than
the text: on held-out synthetic chats about 9 % of its UPDATEs of a changed value name another shown fact, and
for most of those the shown fact nearest the written text is the right one. Its commonest error is worse: a
new fact written as ``UPDATE 0``, which retires a fact that is still true. Such a write restates nothing that
was shown: its text is far from every shown fact, where a real change of value stays close to the fact it
replaces (same person, same attribute).

So, where a config asks for it, the store (not the writer) resolves each UPDATE by its text's cosine similarity
to the shown facts, before the write is applied:

* ``update_target: nearest`` supersedes the shown fact nearest the new text, whatever id was written
  (``written``, the default, keeps the writer's id);
* ``update_floor: f`` (> 0) turns an UPDATE whose text is under ``f`` to every shown fact into an ADD: the new
  fact is kept and nothing true is retired.

The writer's own reply is what its step is scored and trained on (:func:`memrl.memory.gold.ops_score`); the
resolution changes only what reaches the store, and each change is counted in ``memory/update_retargeted`` and
``memory/update_as_add``. How ``configs/synthetic_memory_eval.yaml``'s floor was chosen, and what it changes:
docs/experiments.md ("resolving UPDATEs by similarity").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from memrl.memory.config import UPDATE_TARGETS
from memrl.memory.extract import FactDecision
from memrl.memory.store import FactRecord
from memrl.types import MemoryOpType


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two facts given as ``[n_chunks, dim]`` unit vectors: the best pair of chunks."""
    return float(np.max(np.atleast_2d(a) @ np.atleast_2d(b).T))


def resolve_updates(
    decisions: Sequence[FactDecision],
    neighbours: Sequence[FactRecord],
    encode: Callable[[list[str]], list[np.ndarray]],
    neighbour_vectors: Callable[[int], np.ndarray],
    *,
    target: str,
    floor: float,
) -> tuple[tuple[FactDecision, ...], dict[str, int]]:
    """``decisions`` with every UPDATE resolved as the module doc says, and the counts of what changed
    (``update_retargeted``, ``update_as_add``). ``encode`` embeds texts (one ``[n_chunks, dim]`` array each);
    ``neighbour_vectors(fact_id)`` gives a shown fact's vectors. Nothing is encoded when no UPDATE is written."""
    if target not in UPDATE_TARGETS:
        raise ValueError(f"memory.update_target={target!r}: expected one of {UPDATE_TARGETS}")
    counts = {"update_retargeted": 0, "update_as_add": 0}
    updates = [i for i, d in enumerate(decisions) if d.op is MemoryOpType.UPDATE]
    if not updates or not neighbours or (target == "written" and floor <= 0):
        return tuple(decisions), counts
    shown = [neighbour_vectors(f.fact_id) for f in neighbours]
    vecs = encode([decisions[i].embed_text or decisions[i].text for i in updates])
    out = list(decisions)
    for i, vec in zip(updates, vecs, strict=True):
        d = out[i]
        sims = [similarity(vec, s) for s in shown]
        best = int(np.argmax(sims))
        if sims[best] < floor:
            why = f"UPDATE of fact {d.fact_id} kept as an ADD: its text is {sims[best]:.2f} from every shown fact"
            out[i] = FactDecision(
                MemoryOpType.ADD, text=d.text, speaker=d.speaker, embed_text=d.embed_text,
                extra={**d.extra, "resolved": why},
            )  # fmt: skip
            counts["update_as_add"] += 1
        elif target == "nearest" and neighbours[best].fact_id != d.fact_id:
            why = f"UPDATE of fact {d.fact_id} moved to fact {neighbours[best].fact_id}, nearest its text"
            out[i] = dataclasses.replace(
                d, fact_id=neighbours[best].fact_id, extra={**d.extra, "resolved": why}
            )
            counts["update_retargeted"] += 1
    return tuple(out), counts
