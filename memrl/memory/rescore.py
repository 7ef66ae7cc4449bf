"""From a retriever's ranking to the passages a question is given: the rescoring pipeline after retrieval.

In order: time expressions (:mod:`memrl.memory.time_query`), superseded facts (:mod:`memrl.memory.superseded`,
``memory.superseded_in_prompt``), the speakers the question is about, and passages under a token budget
(:mod:`memrl.memory.passages`, ``memory.neighbour_turns``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memrl.memory.config import MemoryConfig
from memrl.memory.passages import ContextItem, question_speakers, select_passages
from memrl.memory.store import FactRecord, Ranked
from memrl.memory.superseded import as_history, attach_history, supersede_rescore
from memrl.memory.time_query import time_rescore


@dataclass(frozen=True)
class Question:
    """What rescoring reads of a question: its text, the date it was asked (the adapters' timestamp formats; for
    "two weeks ago") and its speaker (for "I"/"my"). None: unknown."""

    text: str
    asked_at: str | None = None
    asked_by: str | None = None


def rescore(
    ranked: Ranked,
    facts: Sequence[FactRecord],
    question: Question,
    cfg: MemoryConfig,
    *,
    k: int,
    tokens: Callable[[FactRecord], int],
    room: int | None = None,
) -> list[ContextItem]:
    """The passages for ``question`` from a retriever's ``ranked`` candidates among ``facts`` (its namespace's
    records, in ingest order): ``k`` hits with their neighbours. ``tokens`` gives a fact's length as shown;
    ``room`` caps the passages' tokens (what the prompt has left)."""
    records = {r.fact_id: r for r in facts}
    ranked = time_rescore(ranked, records, question.text, question.asked_at)
    if cfg.superseded_in_prompt in ("attached", "earlier"):
        earlier_only = cfg.superseded_in_prompt == "earlier"
        ranked, shown = attach_history(ranked, records, question.text, earlier_only=earlier_only)
        ordered = [shown[r.fact_id] for r in facts if r.fact_id in shown]
    else:
        ranked = supersede_rescore(ranked, records, question.text)
        ordered = [as_history(r) for r in facts]
    speakers = question_speakers(question.text, ordered, question.asked_by)
    return select_passages(
        ranked,
        ordered,
        k,
        cfg.neighbour_turns,
        tokens=tokens,
        speakers=speakers,
        max_tokens=room,
    )
