"""How facts an UPDATE superseded reach a question's ranking and prompt (``memory.superseded_in_prompt``).

A superseded fact carries ``extra["superseded_by"]`` (its successor) and ``extra["valid_until"]``. ``separate``:
:func:`supersede_rescore` drops or down-weights it for a question about now and shows it as
:func:`as_history`. ``attached`` / ``earlier``: :func:`attach_history` folds each chain into its current fact,
which shows the earlier values to a question about the past.
"""

from __future__ import annotations

import dataclasses
import re

from memrl.memory.store import FactRecord, Ranked

_WORD = re.compile(r"[a-z0-9]+")
# Score factor of a superseded fact whose successor is not a candidate: below current values, still findable.
SUPERSEDED_WEIGHT = 0.5
# Words of a question about the past: a superseded fact keeps its full score for these.
_PAST_WORDS = frozenset(
    [
        "before",
        "previously",
        "previous",
        "formerly",
        "former",
        "earlier",
        "used",
        "originally",
        "first",
        "old",
        "past",
        "prior",
        "until",
    ]
)
# Phrases of a question about an earlier value ("Which city did Ann live in before moving?"). Narrower than
# _PAST_WORDS: "old" ("How old is Ann?") and "first" do not ask for a superseded value.
_PAST_QUESTION = re.compile(
    r"\b(before|previously|previous|formerly|former|earlier|originally|prior|used? to|in the past|at first)\b"
)


def supersede_rescore(ranked: Ranked, records: dict[int, FactRecord], query: str) -> Ranked:
    """Facts an UPDATE superseded (``extra["superseded_by"]``), for a query that does not ask about the past:
    one whose current successor is also a candidate is dropped, the others' scores are multiplied by
    :data:`SUPERSEDED_WEIGHT`. The current value answers "where does Mia live?"; the old one stays findable for
    "where did Mia live before?" (validity intervals, as Zep's facts carry). Dropped, not only ranked lower:
    with both values in its prompt, even marked "no longer true", SmolLM2-135M answered with the first listed,
    the older one."""
    if not any(records[f].superseded for f, _ in ranked):
        return ranked
    if _PAST_WORDS & set(_WORD.findall(query.lower())):
        return ranked
    candidates = {f for f, _ in ranked}
    out = [
        (f, s * SUPERSEDED_WEIGHT if records[f].superseded else s)
        for f, s in ranked
        if not records[f].superseded or _current(records, f) not in candidates
    ]
    return sorted(out, key=lambda kv: -kv[1])


def _current(records: dict[int, FactRecord], fact_id: int) -> int | None:
    """The fact that stands for ``fact_id`` now: the end of its chain of successors (None if one is gone)."""
    seen = set()
    while fact_id in records and records[fact_id].superseded and fact_id not in seen:
        seen.add(fact_id)
        fact_id = records[fact_id].extra["superseded_by"]
    return fact_id if fact_id in records else None


def asks_about_past(query: str) -> bool:
    """Does ``query`` ask for a value that was true before a change ("... before moving?", "used to")?"""
    return _PAST_QUESTION.search(query.lower()) is not None


def attach_history(
    ranked: Ranked, records: dict[int, FactRecord], query: str, *, earlier_only: bool = False
) -> tuple[Ranked, dict[int, FactRecord]]:
    """``memory.superseded_in_prompt: attached``: every superseded fact stands for its current successor (the end
    of its chain), which takes the best score of the chain, so a question about now gets the current value and
    never the stale one, however close the stale text is to the question. For a question about the past
    (:func:`asks_about_past`) the current fact carries its earlier versions, earliest first:
    ``"Earlier (until 11 May 2024): Ann lives in Lyon. Now: Ann lives in Porto."``: the old value comes first,
    where a small answer model reads an answer from, and marked as earlier, so it reaches the prompt with the
    fact that retrieval finds best. ``earlier_only`` (``superseded_in_prompt: earlier``) leaves "Now: ..." out
    of that text: a question about the past never asks for the current value of a fact that changed.
    A superseded fact whose successor is gone keeps its own "no longer true" text (:func:`as_history`). Returns
    the ranking and the records to show, with those texts: the superseded facts folded into a successor are left
    out, so no passage of adjacent facts brings a stale value back."""
    best: dict[int, float] = {}
    for fid, score in ranked:
        target = _current(records, fid) if records[fid].superseded else fid
        target = fid if target is None else target
        best[target] = max(best.get(target, float("-inf")), score)
    out = sorted(best.items(), key=lambda kv: -kv[1])
    shown = {
        fid: as_history(rec)
        for fid, rec in records.items()
        if not rec.superseded or _current(records, fid) is None
    }
    if asks_about_past(query):
        for fid, _ in out:
            chain = _earlier(records, fid)
            if chain and not records[fid].superseded:
                parts = [f"Earlier (until {r.extra.get('valid_until')}): {r.text}" for r in chain]
                now = [] if earlier_only else [f"Now: {records[fid].text}"]
                shown[fid] = dataclasses.replace(records[fid], text=" ".join([*parts, *now]))
    return out, shown


def _earlier(records: dict[int, FactRecord], fact_id: int) -> list[FactRecord]:
    """The facts ``fact_id`` superseded, directly or through a chain, earliest first."""
    before = {r.extra["superseded_by"]: r for r in records.values() if r.superseded}
    chain, seen = [], {fact_id}
    while fact_id in before and before[fact_id].fact_id not in seen:
        fact_id = before[fact_id].fact_id
        seen.add(fact_id)
        chain.append(records[fact_id])
    return chain[::-1]


def as_history(rec: FactRecord) -> FactRecord:
    """A superseded fact as the prompt shows it: its text with the date it stopped being true."""
    if not rec.superseded:
        return rec
    until = rec.extra.get("valid_until")
    return dataclasses.replace(rec, text=f"{rec.text} (no longer true since {until}; replaced)")
