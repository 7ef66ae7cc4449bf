"""Gold memory operations, where a dataset knows them, for memory-write steps (demonstrations and the op term).

An adapter that knows the right decision for a history turn puts it in the turn's metadata (the synthetic task
does, for every turn): ``memory_op`` (``ADD`` | ``UPDATE`` | ``NOOP``), ``memory_fact`` (the fact as one
sentence, "Mia lives in Rome."), ``memory_person`` / ``memory_value`` (who and what it states) and, for an
UPDATE, ``memory_stale`` (the value it replaces). Turns without ``memory_op`` are unknown: a write that reads one
has no gold operations (outcome-only credit, as on LoCoMo).

Facts are model-written paraphrases, so a fact "holds" a value when it names the person and the value as words
(:func:`holds`), not when it matches a template.

``memory.extractor: gold`` writes these operations into the store: the memory a perfect policy writer leaves,
reading what the policy writer reads (its ``write_neighbours`` current facts nearest the turn). It is the ceiling
of any trained writer under the same answer policy, and the bench's check on its own scoring.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memrl.memory.config import MemoryConfig
from memrl.memory.extract import ExtractionRequest, FactDecision, TextGenerator
from memrl.memory.store import FactRecord
from memrl.memory.writer import parse_ops, turn_line
from memrl.types import MemoryOpType, TurnRole, TurnSpec

_WORD = re.compile(r"[a-z0-9]+")


def holds(text: str, person: str, value: str) -> bool:
    """Does ``text`` name both ``person`` and ``value`` (as whole words, any case)?"""
    words = set(_WORD.findall(text.lower()))
    return person.lower() in words and all(w in words for w in _WORD.findall(value.lower()))


def known(turns: Sequence[TurnSpec]) -> bool:
    return bool(turns) and all(t.metadata.get("memory_op") for t in turns)


def _stale_id(turn: TurnSpec, neighbours: Sequence[FactRecord]) -> int | None:
    person, stale = turn.metadata.get("memory_person", ""), turn.metadata.get("memory_stale", "")
    return next((i for i, f in enumerate(neighbours) if holds(f.text, person, stale)), None)


def gold_text(turns: Sequence[TurnSpec], neighbours: Sequence[FactRecord]) -> str | None:
    """The right reply to a write of ``turns`` given the shown ``neighbours`` (one line per turn), or ``None``
    when a turn's decision is unknown. An UPDATE whose stale fact was not shown becomes an ADD."""
    if not known(turns):
        return None
    lines = []
    for turn in turns:
        op, fact = turn.metadata["memory_op"], turn.metadata.get("memory_fact", "")
        if op == "NOOP":
            lines.append("NOOP")
            continue
        target = _stale_id(turn, neighbours) if op == "UPDATE" else None
        lines.append(f"UPDATE {target} {fact}" if target is not None else f"ADD {fact}")
    return "\n".join(lines)


def ops_right(
    turns: Sequence[TurnSpec], neighbours: Sequence[FactRecord], decisions: Sequence[FactDecision]
) -> bool | None:
    """Do ``decisions`` do what the gold operations of ``turns`` do? ``None`` when unknown. Right means: every
    gold ADD has an ADD naming its person and value (or an UPDATE of a fact that already says so), every gold
    UPDATE has an UPDATE of a shown fact holding the stale value whose new text holds the new value, and nothing
    else is written (no DELETE, no write for a NOOP turn)."""
    score = ops_score(turns, neighbours, decisions)
    return None if score is None else score == 1.0


def ops_score(
    turns: Sequence[TurnSpec], neighbours: Sequence[FactRecord], decisions: Sequence[FactDecision]
) -> float | None:
    """How much of the gold operations ``decisions`` get right, as an F1 over writes: precision = the written
    operations that match a distinct gold ADD/UPDATE (as :func:`ops_right` matches them) over all written ones,
    recall = the gold writes matched over all gold writes; 1 when both are empty (all NOOP, nothing written).
    A write of six lines with five right earns ~0.9 here, where :func:`ops_right` says only "not right": the
    partial credit that lets RL improve a write line by line. ``None`` when unknown."""
    if not known(turns):
        return None
    writes = [d for d in decisions if d.op is not MemoryOpType.NOOP]
    wanted = [t for t in turns if t.metadata["memory_op"] != "NOOP"]
    if not writes and not wanted:
        return 1.0
    by_id = {f.fact_id: f for f in neighbours}
    free = list(writes)
    for turn in wanted:
        match = next((d for d in free if _matches(turn, d, neighbours, by_id)), None)
        if match is not None:
            free.remove(match)
    matched = len(writes) - len(free)
    if not matched:
        return 0.0
    precision, recall = matched / len(writes), matched / len(wanted)
    return 2 * precision * recall / (precision + recall)


def _matches(
    turn: TurnSpec, d: FactDecision, neighbours: Sequence[FactRecord], by_id: dict[int, FactRecord]
) -> bool:
    person, value = turn.metadata.get("memory_person", ""), turn.metadata.get("memory_value", "")
    if not holds(d.text, person, value):
        return False
    old = by_id.get(d.fact_id) if d.op is MemoryOpType.UPDATE else None
    if turn.metadata["memory_op"] == "UPDATE" and _stale_id(turn, neighbours) is not None:
        stale = turn.metadata.get("memory_stale", "")
        return d.op is MemoryOpType.UPDATE and old is not None and holds(old.text, person, stale)
    if d.op is MemoryOpType.UPDATE:
        # Where the gold is an ADD, an UPDATE supersedes a fact that is still true, unless that fact already says
        # the same (a restatement): the per-turn writer's commonest error, replacing a person's other fact.
        return old is not None and holds(old.text, person, value)
    return d.op is MemoryOpType.ADD


class GoldExtractor:
    """``memory.extractor: gold``: each turn's gold operations, written as the policy writer writes them."""

    needs_neighbours = True
    writes_steps = False

    def __init__(self, cfg: MemoryConfig, generate_text: TextGenerator | None = None) -> None:
        self.neighbour_count = cfg.write_neighbours

    @staticmethod
    def neighbour_query(turn: TurnSpec) -> str:
        return turn_line(turn)  # the text the policy writer's neighbours are searched with

    def extract(self, requests: Sequence[ExtractionRequest]) -> list[list[FactDecision]]:
        out = []
        for req in requests:
            if req.turn.role is not TurnRole.HISTORY:  # the agent's own answer states nothing the chat knows
                out.append(
                    [FactDecision(MemoryOpType.NOOP, reason="gold memory remembers history turns only")]
                )
                continue
            text = gold_text((req.turn,), req.neighbours)
            if text is None:
                raise ValueError(
                    f"memory.extractor=gold: history turn {req.turn.turn_id} has no gold operation (metadata "
                    "'memory_op'); only datasets that know them (synthetic) can use it"
                )
            out.append(list(parse_ops(text, req.neighbours).decisions))
        return out
