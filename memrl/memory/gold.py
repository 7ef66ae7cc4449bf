"""Gold memory operations, where a dataset knows them, for memory-write steps (demonstrations and the op term).

An adapter that knows the right decision for a history turn puts it in the turn's metadata (the synthetic task
does, for every turn): ``memory_op`` (``ADD`` | ``UPDATE`` | ``NOOP``), ``memory_fact`` (the fact as one
sentence, "Mia lives in Rome."), ``memory_person`` / ``memory_value`` (who and what it states) and, for an
UPDATE, ``memory_stale`` (the value it replaces). Turns without ``memory_op`` are unknown: a write that reads one
has no gold operations (outcome-only credit, as on LoCoMo).

Facts are model-written paraphrases, so a fact "holds" a value when it names the person and the value as words
(:func:`holds`), not when it matches a template.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memrl.memory.extract import FactDecision
from memrl.memory.store import FactRecord
from memrl.types import MemoryOpType, TurnSpec

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
    gold ADD has an ADD (or UPDATE) naming its person and value, every gold UPDATE has an UPDATE of a shown fact
    holding the stale value whose new text holds the new value, and nothing else is written (no DELETE, no
    write for a NOOP turn)."""
    if not known(turns):
        return None
    writes = [d for d in decisions if d.op is not MemoryOpType.NOOP]
    wanted = [t for t in turns if t.metadata["memory_op"] != "NOOP"]
    if len(writes) != len(wanted):
        return False
    by_id = {f.fact_id: f for f in neighbours}
    for turn in wanted:
        person, value = turn.metadata.get("memory_person", ""), turn.metadata.get("memory_value", "")
        stale = turn.metadata.get("memory_stale", "")
        match = None
        for d in writes:
            if not holds(d.text, person, value):
                continue
            if turn.metadata["memory_op"] == "UPDATE" and _stale_id(turn, neighbours) is not None:
                old = by_id.get(d.fact_id)
                if d.op is not MemoryOpType.UPDATE or old is None or not holds(old.text, person, stale):
                    continue
            elif d.op not in (MemoryOpType.ADD, MemoryOpType.UPDATE):
                continue
            match = d
            break
        if match is None:
            return False
        writes.remove(match)
    return True
