"""Where a policy-written UPDATE or ADD lands: ``memory.update_target``, ``update_min_cosine`` and
``add_supersede_cosine``.

The writer names the fact an UPDATE supersedes by a shown id, and SmolLM2-135M gets the id wrong more often than
the text: some of its UPDATEs of a changed value name another shown fact, and for most of those the shown fact
nearest the written text is the right one. Its commonest error is worse: a new fact written as ``UPDATE 0``,
which retires a fact that is still true. Such a write restates nothing that was shown: its text is far from
every shown fact, where a real change of value stays close to the fact it replaces (same person, same attribute).

So, where a config asks for it, the store (not the writer) resolves each UPDATE by its text's cosine similarity
to the shown facts, before the write is applied:

* ``update_target: nearest`` supersedes the shown fact nearest the new text, whatever id was written
  (``written``, the default, keeps the writer's id);
* ``update_min_cosine: f`` (> 0, the floor) turns an UPDATE whose text is under ``f`` to every shown fact into
  an ADD: the new fact is kept and nothing true is retired;
* ``add_supersede_cosine: c`` (> 0, the ceiling) turns an ADD whose text is at least ``c`` to a shown fact into
  an UPDATE of that fact: the writer's other error, a change written as a new fact beside the stale one ("ADD
  Leo has 7 siblings." with "Leo has 2 siblings." shown), differs from the fact it replaces in the value alone.
* ``update_target: frame`` first reads the words: a write that says what a shown fact says with another value
  (:func:`same_frame`: "Halima does surfing." against "Halima does badminton.") supersedes that fact, as an
  UPDATE or an ADD, whatever its cosine; other writes are resolved as under ``nearest``. MiniLM puts a
  person's two sports, cities or languages around the floor and mostly under the ceiling, so by cosine alone
  many changes would stay ADDs beside the stale value. The rule's known miss: one person's two true values of a
  relation that holds many ("Ann has a dog called Rex." and "Ann has a dog called Bo.") read as a change; a
  writer that names the relation per value avoids it.

The writer's own reply is what its step is scored and trained on (:func:`memrl.memory.gold.ops_score`); the
resolution changes only what reaches the store, and each change is counted in ``memory/update_retargeted``,
``memory/update_as_add`` and ``memory/add_as_update``. How ``configs/synthetic_memory_eval.yaml``'s floor and
ceiling were chosen, from the training split's gold writes, and what they change: docs/experiments.md ("resolving
UPDATEs by similarity", "changes written as ADDs").
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memrl.memory.extract import FactDecision
from memrl.memory.store import FactRecord
from memrl.types import MemoryOpType


def similarity(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two facts given as ``[n_chunks, dim]`` unit vectors: the best pair of chunks."""
    return float(np.max(np.atleast_2d(a) @ np.atleast_2d(b).T))


# How a resolved ADD's note starts: resolved_counts tells the three kinds of change apart by it.
_ADD_AS_UPDATE = "ADD kept as an UPDATE"


def is_active(target: str, floor: float, ceiling: float = 0.0) -> bool:
    """Does the store resolve writes at all under these settings?"""
    return target != "written" or floor > 0 or ceiling > 0


_WORD = re.compile(r"[\w']+")
# A value is a few words ("badminton", "a fencing enthusiast"); a longer differing span is another statement.
_MAX_VALUE_WORDS = 3


def same_frame(new: str, old: str) -> bool:
    """Does ``new`` say what ``old`` says with another value: the same words but for one span of at most
    three, after at least two shared leading words (the person and the relation: "Halima does", "Ann's pet is
    called")? Case and punctuation aside; an identical text is no change."""
    a, b = _WORD.findall(new.lower()), _WORD.findall(old.lower())
    head = len(os.path.commonprefix([a, b]))
    tail = len(os.path.commonprefix([a[head:][::-1], b[head:][::-1]]))
    rest_a, rest_b = len(a) - head - tail, len(b) - head - tail
    return head >= 2 and 0 < rest_a <= _MAX_VALUE_WORDS and 0 < rest_b <= _MAX_VALUE_WORDS


def to_resolve(
    decisions: Sequence[FactDecision],
    neighbours: Sequence[FactRecord],
    ceiling: float = 0.0,
    target: str = "written",
) -> list[FactDecision]:
    """The writes of ``decisions`` that resolution reads, in order (none when no fact was shown): the UPDATEs,
    and the ADDs too under a ceiling or the frame rule. The caller embeds their texts, all writes of a batch in
    one encode call."""
    both = ceiling > 0 or target == "frame"
    ops = (MemoryOpType.UPDATE, MemoryOpType.ADD) if both else (MemoryOpType.UPDATE,)
    return [d for d in decisions if d.op in ops] if neighbours else []


def resolve_updates(
    decisions: Sequence[FactDecision],
    neighbours: Sequence[FactRecord],
    vectors: Sequence[np.ndarray],
    neighbour_vectors: Callable[[int], np.ndarray],
    *,
    target: str,
    floor: float,
    ceiling: float = 0.0,
) -> tuple[FactDecision, ...]:
    """``decisions`` with every UPDATE (and, under a ceiling, every ADD) resolved as the module doc says; a changed
    decision says why in ``extra["resolved"]``. ``vectors``: one ``[n_chunks, dim]`` array per decision of
    :func:`to_resolve`; ``neighbour_vectors(fact_id)`` gives a shown fact's vectors."""
    todo = to_resolve(decisions, neighbours, ceiling, target)
    if len(vectors) != len(todo):
        raise ValueError(f"resolve_updates: {len(vectors)} vectors for {len(todo)} writes to resolve")
    if not todo or not is_active(target, floor, ceiling):
        return tuple(decisions)
    shown = [neighbour_vectors(f.fact_id) for f in neighbours]
    resolved = {}
    for d, vec in zip(todo, vectors, strict=True):
        sims = [similarity(vec, s) for s in shown]
        best = int(np.argmax(sims))
        framed = (
            [i for i, f in enumerate(neighbours) if same_frame(d.text, f.text)] if target == "frame" else []
        )
        if framed:
            i = max(framed, key=lambda i: sims[i])
            fid = neighbours[i].fact_id
            if d.op is MemoryOpType.ADD or fid != d.fact_id:
                was = (
                    f"{_ADD_AS_UPDATE} of fact {fid}"
                    if d.op is MemoryOpType.ADD
                    else f"UPDATE of fact {d.fact_id}"
                )
                why = f"{was}: its text restates fact {fid} with another value"
                resolved[id(d)] = dataclasses.replace(
                    d, op=MemoryOpType.UPDATE, fact_id=fid, supersede=True, extra={**d.extra, "resolved": why}
                )
        elif d.op is MemoryOpType.ADD:
            if ceiling > 0 and sims[best] >= ceiling:
                fid = neighbours[best].fact_id
                why = f"{_ADD_AS_UPDATE} of fact {fid}: its text is {sims[best]:.2f} to it"
                resolved[id(d)] = dataclasses.replace(
                    d, op=MemoryOpType.UPDATE, fact_id=fid, supersede=True, extra={**d.extra, "resolved": why}
                )
        elif sims[best] < floor:
            why = f"UPDATE of fact {d.fact_id} kept as an ADD: its text is {sims[best]:.2f} to the nearest shown fact"
            resolved[id(d)] = FactDecision(
                MemoryOpType.ADD, text=d.text, speaker=d.speaker, embed_text=d.embed_text,
                extra={**d.extra, "resolved": why},
            )  # fmt: skip
        elif target != "written" and neighbours[best].fact_id != d.fact_id:
            why = f"UPDATE of fact {d.fact_id} moved to fact {neighbours[best].fact_id}, nearest its text"
            resolved[id(d)] = dataclasses.replace(
                d, fact_id=neighbours[best].fact_id, extra={**d.extra, "resolved": why}
            )
    return tuple(resolved.get(id(d), d) for d in decisions)


def resolved_counts(decisions: Sequence[FactDecision]) -> dict[str, int]:
    """What resolution changed among ``decisions``: ``update_as_add``, ``update_retargeted``, ``add_as_update``."""
    notes = [d for d in decisions if "resolved" in d.extra]
    adds = sum(d.op is MemoryOpType.ADD for d in notes)
    ups = sum(d.extra["resolved"].startswith(_ADD_AS_UPDATE) for d in notes)
    return {"update_as_add": adds, "update_retargeted": len(notes) - adds - ups, "add_as_update": ups}


def resolve_batch(
    episode_ids: Sequence[str],
    shown: Sequence[Sequence[FactRecord]],
    samples: Sequence[Sequence[Any]],
    encode: Callable[[list[str]], list[np.ndarray]],
    vectors_of: Callable[[str, int], np.ndarray],
    *,
    target: str,
    floor: float,
    ceiling: float = 0.0,
) -> tuple[list[list[Any]], Counter[str]]:
    """One write batch resolved: ``samples[i]`` are write i's replies (``WriteSample``), ``shown[i]`` the facts
    it was shown from episode ``episode_ids[i]``'s store (``vectors_of(episode_id, fact_id)``). The UPDATE texts
    of the whole batch are embedded in one ``encode`` call. Returns the replies (a changed one carries
    ``resolved``) and the ``memory/*`` counts of :func:`resolved_counts`."""
    counts: Counter[str] = Counter()
    if not is_active(target, floor, ceiling):
        return [list(alts) for alts in samples], counts
    todo = [
        to_resolve(alt.ops.decisions, nb, ceiling, target)
        for nb, alts in zip(shown, samples, strict=True)
        for alt in alts
    ]
    texts = [d.embed_text or d.text for ds in todo for d in ds]
    vecs, pending = iter(encode(texts) if texts else []), iter(todo)
    out = []
    for ns, nb, alts in zip(episode_ids, shown, samples, strict=True):
        replies = []
        for alt in alts:
            mine = [next(vecs) for _ in next(pending)]
            decisions = resolve_updates(
                alt.ops.decisions,
                nb,
                mine,
                lambda fid, ns=ns: vectors_of(ns, fid),
                target=target,
                floor=floor,
                ceiling=ceiling,
            )
            changed = resolved_counts(decisions)
            counts.update({f"memory/{k}": n for k, n in changed.items() if n})
            replies.append(dataclasses.replace(alt, resolved=decisions) if any(changed.values()) else alt)
        out.append(replies)
    return out, counts
