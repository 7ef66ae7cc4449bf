"""Turning a ranking of facts into the retrieved passages: fixed windows, or passages chosen under a budget.

With ``neighbour_turns = 0`` the context is the first ``k`` ranked facts, one item each. With ``n > 0`` it is
built from the conversation around the hits:

1. **Budget.** The tokens that ±``n`` windows around the first ``k`` hits would take (overlaps counted once):
   the passages never cost more context than fixed windows do.
2. **Value.** A fact is worth its own fused score plus :data:`SPREAD` ``** d`` times the score of every
   candidate ``d ≤ 2n`` facts away (ingest order): evidence sits next to what matches the question (the
   question a turn answers, the same speaker's next turn), and a stretch that several hits point at is worth
   more than an isolated lucky match. Facts said by a speaker the question is about (one it names, or its
   asker when it says "I", :func:`question_speakers`) are worth ``1 + SPEAKER_WEIGHT`` times as much.
3. **Selection.** Facts are taken by value while the budget allows; adjacent ones form one passage (texts
   joined on one line), passages are returned best first.

Within the same context share as fixed windows, passages find more of the evidence (docs/benchmarks.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memrl.memory.store import FactRecord, Ranked

WINDOW_SEPARATOR = " | "  # joins the facts of a window or passage; never a newline
# A hit lends its neighbours half its score per step away: on LoCoMo an evidence turn sits one turn from a hit
# about as often as two turns away (the same speaker's next turn), and nearby decays score about the same.
SPREAD = 0.5
# Facts said by a speaker the question is about count double: the evidence for a question about someone is
# mostly what they said themselves (docs/experiments.md).
SPEAKER_WEIGHT = 1.0
_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class ContextItem:
    """One retrieved item: ``facts`` in ingest order (one fact, a window or a passage) and ``lead``, the fact
    that earned it its place (the hit, or the passage's most valuable fact)."""

    facts: tuple[FactRecord, ...]
    lead: FactRecord
    score: float

    @property
    def text(self) -> str:
        return WINDOW_SEPARATOR.join(f.text for f in self.facts)

    @property
    def source_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(s for f in self.facts for s in f.source_ids))


def fixed_windows(ranked: Ranked, ordered: Sequence[FactRecord], k: int, n: int) -> list[ContextItem]:
    """The first ``k`` hits, each with the ``n`` facts before and after it (ingest order) that no better hit
    already carried. A hit that a better hit's window already carried contributes only its uncarried
    neighbours (this extends a relevant stretch), and is skipped when it has none."""
    pos = {r.fact_id: i for i, r in enumerate(ordered)}
    seen: set[int] = set()
    out: list[ContextItem] = []
    for fid, score in ranked:
        if len(out) == k:
            break
        p = pos[fid]
        window = [r for r in ordered[max(0, p - n) : p + n + 1] if r.fact_id not in seen]
        if window:
            seen.update(r.fact_id for r in window)
            out.append(ContextItem(tuple(window), ordered[p], float(score)))
    return out


def named_speakers(query: str, ordered: Sequence[FactRecord]) -> set[str]:
    """Speakers of the namespace whose (one-word, case-insensitive) name the query contains."""
    words = set(_WORD.findall(query.lower()))
    return {r.speaker for r in ordered if r.speaker and r.speaker.lower() in words}


_FIRST_PERSON = frozenset(["i", "me", "my", "mine", "myself"])


def question_speakers(query: str, ordered: Sequence[FactRecord], asked_by: str | None = None) -> set[str]:
    """The speakers a question is about: those it names, and its asker ``asked_by`` when it speaks in the first
    person ("How many plants did I buy?", "Can you recommend a book I would like?"). A question about oneself
    is answered by what one said, where the assistant's long topical replies otherwise take the budget
    (LongMemEval's questions are the user's about their own sessions). Questions that also say "you" ("What
    did you recommend?") get the prior too: the preference questions ask "you" about what "I" like."""
    speakers = named_speakers(query, ordered)
    words = set(_WORD.findall(query.lower()))
    if asked_by and words & _FIRST_PERSON and any(r.speaker == asked_by for r in ordered):
        speakers.add(asked_by)
    return speakers


def select_passages(
    ranked: Ranked,
    ordered: Sequence[FactRecord],
    k: int,
    n: int,
    *,
    tokens: Callable[[FactRecord], int],
    speakers: set[str] = frozenset(),
    max_tokens: int | None = None,
) -> list[ContextItem]:
    """Passages worth the most under the budget of ``fixed_windows(ranked, ordered, k, n)`` (module docstring),
    or ``max_tokens`` when that is smaller (the room a prompt has left). ``tokens`` gives a fact's length in
    the unit of the budget."""
    if n == 0 or not ranked:
        return fixed_windows(ranked, ordered, k, n)
    budget = sum(tokens(f) for item in fixed_windows(ranked, ordered, k, n) for f in item.facts)
    if max_tokens is not None:
        budget = min(budget, max_tokens)
    pos = {r.fact_id: i for i, r in enumerate(ordered)}
    value: dict[int, float] = {}
    for fid, score in ranked:
        p = pos[fid]
        for d in range(-2 * n, 2 * n + 1):
            if 0 <= p + d < len(ordered):
                value[p + d] = value.get(p + d, 0.0) + score * SPREAD ** abs(d)
    for p in value:
        if ordered[p].speaker in speakers:
            value[p] *= 1.0 + SPEAKER_WEIGHT
    chosen: list[int] = []
    used = 0
    for p in sorted(value, key=lambda q: (-value[q], q)):
        if value[p] <= 0:
            break
        cost = tokens(ordered[p])
        if used + cost <= budget:  # a fact too long for what is left is passed over, a shorter one may fit
            chosen.append(p)
            used += cost
    runs: list[list[int]] = []
    for p in sorted(chosen):
        if runs and p == runs[-1][-1] + 1:
            runs[-1].append(p)
        else:
            runs.append([p])
    items = []
    for run in runs:
        lead = max(run, key=lambda q: (value[q], -q))
        items.append(ContextItem(tuple(ordered[q] for q in run), ordered[lead], value[lead]))
    return sorted(items, key=lambda it: -it.score)
