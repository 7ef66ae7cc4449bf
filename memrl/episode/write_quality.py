"""How well the policy wrote memory in a run, against the dataset's gold operations (``memrl eval``'s
``memory_writes``).

``memrl bench extract`` scores a writer on 20 episodes with their own store; an evaluation already holds every
applied write of its episodes (200 × 18 on the synthetic eval config), each with the gold reply for the store it
read (``extra["gold_ops"]``, :func:`memrl.memory.gold.gold_text`) and whether its operations were right
(``op_right``). This reads them back from the arm's Parquet rows, so the writer's quality is reported on the same
episodes whose answers are scored, at no extra cost. Decisions are matched per write as multisets of operation
kinds (a chunk of several turns has one gold line per turn), so for one-turn writes recall and precision are the
plain per-decision ones, and ``confusion`` (gold → written) counts the one-turn writes.

``faithfulness`` covers every applied write, gold known or not: how many wrote a fact the turns they read do not
support (:mod:`memrl.memory.faithfulness`), split by the kind of turn read (small talk / first statement /
change), so an evaluation on the held-out chats (``data.adapter: chats``) shows whether the writer invents facts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from memrl.episode.rows import step_meta_of_row
from memrl.memory.faithfulness import FaithfulnessTally, render_faithfulness, write_kind


def gold_kinds(gold_ops: str) -> list[str]:
    """``"UPDATE 0 Mia lives in Rome.\\nNOOP"`` → ``["UPDATE", "NOOP"]``."""
    return [line.split()[0] for line in gold_ops.splitlines() if line.split()]


def write_quality(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Summary of the applied memory writes among ``rows`` (Parquet rows as dicts, read by
    :func:`~memrl.episode.rows.step_meta_of_row`: ``turn_role``, ``role``, ``write``, ``memory_ops``, and ``extra``
    where older runs kept the write there): the gold-scored block over those whose gold operations are known, and
    ``faithfulness`` over every applied write; ``None`` when the policy wrote nothing (rule memory)."""
    gold_n: Counter[str] = Counter()
    written_n: Counter[str] = Counter()
    matched: Counter[str] = Counter()
    confusion: dict[str, Counter[str]] = {}
    writes = right = 0
    score_sum = 0.0
    faith = FaithfulnessTally()
    for row in rows:
        meta = step_meta_of_row(dict(row))
        write = meta.write
        if write is None or not write.applied:
            continue
        read = " / ".join(meta.extra.get("read_turns", ()))
        faith.add(write_kind(write.turn_kinds), write.facts_written, write.unsupported_facts, read)
        if write.gold_ops is None:
            continue
        gold = Counter(gold_kinds(write.gold_ops))
        written = Counter(op.op.value for op in meta.memory_ops)
        writes += 1
        right += bool(write.op_right)
        score_sum += write.op_score or 0.0
        gold_n.update(gold)
        written_n.update(written)
        matched.update(gold & written)
        if sum(gold.values()) == 1 and sum(written.values()) == 1:
            (g,), (w,) = gold, written
            confusion.setdefault(g, Counter())[w] += 1
    if not faith.writes:
        return None
    out: dict[str, Any] = {"faithfulness": faith.summary()}
    if not writes:
        return out
    return {
        **out,
        "writes": writes,
        "ops_right": right / writes,
        "op_score_mean": score_sum / writes,
        "recall": {k: matched[k] / n for k, n in sorted(gold_n.items())},
        "precision": {k: matched[k] / n for k, n in sorted(written_n.items())},
        "gold": dict(sorted(gold_n.items())),
        "written": dict(sorted(written_n.items())),
        "confusion": {g: dict(sorted(c.items())) for g, c in sorted(confusion.items())},
    }


def render_write_quality(arm: str, q: Mapping[str, Any]) -> str:
    """One line for ``memrl eval``'s table: ``memory writes (memory): 3,600, ops right 0.855; recall ADD 0.779 …``,
    and the invented facts by turn kind."""
    faith = render_faithfulness(q["faithfulness"]) if "faithfulness" in q else ""
    if "writes" not in q:  # no gold operations: faithfulness alone
        return f"memory writes ({arm}): {q['faithfulness']['writes']:,}; {faith}"
    recall = " ".join(f"{k} {v:.3f}" for k, v in q["recall"].items())
    precision = " ".join(f"{k} {v:.3f}" for k, v in q["precision"].items())
    return (
        f"memory writes ({arm}): {q['writes']:,}, ops right {q['ops_right']:.3f}; "
        f"recall {recall}; precision {precision}" + (f"; {faith}" if faith else "")
    )
