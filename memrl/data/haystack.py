"""LongMemEval ``_S``-like haystacks built from the oracle file (evidence sessions only), for development.

    memrl data haystack --oracle longmemeval_oracle.json --sessions 50 --out longmemeval_s_like.json

LongMemEval builds ``_S`` by hiding each question's evidence sessions among filler sessions, dating them and
sorting the haystack by date. The oracle file holds only the evidence, so the filler here is drawn from the
evidence sessions of OTHER questions (the same simulated-user chats LongMemEval draws half of its filler from):

* every question keeps its own sessions, turns (``has_answer`` flags included) and dates;
* ``sessions - len(evidence)`` filler sessions are drawn without replacement from the distinct sessions of the
  other questions; a question and its abstention twin (``<id>_abs``) never fill each other's haystack, and
  filler turns lose their ``has_answer`` flags (they answer another question), as LongMemEval's builder does;
* each filler session gets a random date between ``filler_days`` before the first evidence session and the
  question date, then the haystack is sorted by date (ties in a random order), so evidence sits at random
  positions and keeps its order;
* the output has the official ``_s`` format and field order (``haystack_session_ids`` sorted by date), which the
  ``longmemeval`` adapter reads unchanged.

What differs from the real ``_S``: no ShareGPT / UltraChat filler (all filler is user-centric chat, topically
closer to the evidence: if anything harder for retrieval), and no check that a filler session does not state a
conflicting fact about "the user" (LongMemEval filters by user attribute, which the oracle file does not carry),
so answers on these haystacks are for retrieval recall, not for QA scoring. At 50 sessions a haystack is longer
than a real ``_S`` one.

Deterministic: a question's haystack depends only on the oracle file, ``seed``, ``sessions`` and
``filler_days`` (not on ``questions`` or on the other questions' order). Records are written one at a time, so the
output is never held in memory.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.data.adapters import SkipReport, iter_json_records, run_adapter

DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"  # LongMemEval's, e.g. "2023/05/21 (Sun) 19:50"
ABSTENTION_SUFFIX = "_abs"
FIELDS = (  # the official files' field order
    "question_id",
    "question_type",
    "question",
    "answer",
    "question_date",
    "haystack_dates",
    "haystack_session_ids",
    "haystack_sessions",
    "answer_session_ids",
)


@dataclass(frozen=True)
class HaystackSpec:
    """How to build each haystack: ``sessions`` in total (evidence + filler; a question with more evidence
    keeps all of it), filler dates drawn from ``filler_days`` before the first evidence session up to the
    question date, ``seed`` for the draws, ``questions`` = N questions spread evenly over the file (every
    k-th: the official files are grouped by question type, so the first N would all be one type)."""

    sessions: int = 50
    seed: int = 0
    filler_days: int = 30
    questions: int | None = None

    def __post_init__(self) -> None:
        if self.sessions < 1:
            raise ValueError(f"sessions={self.sessions}: must be >= 1 (sessions per haystack, e.g. 50)")
        if self.filler_days < 0:
            raise ValueError(f"filler_days={self.filler_days}: must be >= 0")
        if self.questions is not None and self.questions < 1:
            raise ValueError(f"questions={self.questions}: must be >= 1 (or omitted for every question)")


@dataclass(frozen=True)
class _Session:
    session_id: str
    turns: list[dict[str, Any]]  # role + content only (filler carries no has_answer flags)
    owners: frozenset[str]  # base question ids (without _abs) whose haystack holds it


def _base_id(question_id: str) -> str:
    return question_id.removesuffix(ABSTENTION_SUFFIX)


def _load(oracle: str) -> list[dict[str, Any]]:
    """The oracle records, after the strict ``longmemeval`` adapter accepted the whole file (so a bad record
    fails here naming file, record and field, never half-way through writing)."""
    run_adapter("longmemeval", oracle, split="all")
    records = [rec for _, rec in iter_json_records(oracle, lenient=False, report=SkipReport())]
    for rec in records:  # some exports store list fields as JSON text; the adapter accepts both
        for key in ("haystack_dates", "haystack_session_ids", "haystack_sessions", "answer_session_ids"):
            if isinstance(rec[key], str):
                rec[key] = json.loads(rec[key])
    return records


def filler_pool(records: list[dict[str, Any]]) -> list[_Session]:
    """Every distinct session of the file (first occurrence by id), with the questions that hold it."""
    owners: dict[str, set[str]] = {}
    turns: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        for sid, session in zip(rec["haystack_session_ids"], rec["haystack_sessions"], strict=True):
            owners.setdefault(sid, set()).add(_base_id(rec["question_id"]))
            turns.setdefault(sid, [{"role": t["role"], "content": t["content"]} for t in session])
    return [_Session(sid, turns[sid], frozenset(owners[sid])) for sid in sorted(turns)]


def _random_date(rng: random.Random, lo: dt.datetime, hi: dt.datetime) -> dt.datetime:
    minutes = max(0, int((hi - lo).total_seconds() // 60))
    return lo + dt.timedelta(minutes=rng.randint(0, minutes))


def build_record(rec: dict[str, Any], pool: list[_Session], spec: HaystackSpec) -> dict[str, Any]:
    """One question's ``_S``-like record (see the module docstring for the construction)."""
    qid = rec["question_id"]
    rng = random.Random(f"{spec.seed}:{spec.sessions}:{spec.filler_days}:{qid}")
    own_ids = set(rec["haystack_session_ids"])
    candidates = [s for s in pool if s.session_id not in own_ids and _base_id(qid) not in s.owners]
    n_filler = min(len(candidates), max(0, spec.sessions - len(own_ids)))
    filler = rng.sample(candidates, n_filler)
    dates = [dt.datetime.strptime(d, DATE_FORMAT) for d in rec["haystack_dates"]]
    qdate = dt.datetime.strptime(rec["question_date"], DATE_FORMAT)
    lo = min(dates) - dt.timedelta(days=spec.filler_days)
    hi = max(qdate, max(dates))
    entries = [
        (d, rng.random(), sid, s)
        for d, sid, s in zip(dates, rec["haystack_session_ids"], rec["haystack_sessions"], strict=True)
    ]
    entries += [(_random_date(rng, lo, hi), rng.random(), s.session_id, s.turns) for s in filler]
    entries.sort(key=lambda e: (e[0], e[1]))
    out = {key: rec[key] for key in FIELDS}
    out["haystack_dates"] = [d.strftime(DATE_FORMAT) for d, *_ in entries]
    out["haystack_session_ids"] = [sid for _, _, sid, _ in entries]
    out["haystack_sessions"] = [turns for *_, turns in entries]
    return out


def build_haystacks(oracle: str, spec: HaystackSpec) -> Iterator[dict[str, Any]]:
    """``_S``-like records, one per oracle question (``spec.questions`` of them, evenly spread), in file
    order. Filler is drawn from every question of the file, whatever the subset."""
    records = _load(oracle)
    pool = filler_pool(records)
    for i in spread(len(records), spec.questions):
        yield build_record(records[i], pool, spec)


def spread(total: int, n: int | None) -> list[int]:
    """``n`` indices evenly spaced over ``range(total)`` (all of them when ``n`` is None or ≥ ``total``)."""
    if n is None or n >= total:
        return list(range(total))
    return sorted({i * total // n for i in range(n)})


def write_haystacks(oracle: str, out: str, spec: HaystackSpec) -> dict[str, Any]:
    """Write the ``_S``-like file (a JSON array, one record at a time, via a temp file renamed into place so a
    killed build never leaves a half file) and return a summary: questions, sessions per haystack (min / max)
    and output size."""
    target = Path(out)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    sizes: list[int] = []
    with tmp.open("w", encoding="utf-8") as fh:
        fh.write("[")
        for i, rec in enumerate(build_haystacks(oracle, spec)):
            fh.write(",\n" if i else "\n")
            json.dump(rec, fh, ensure_ascii=False)
            sizes.append(len(rec["haystack_session_ids"]))
        fh.write("\n]\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    return {
        "out": str(target),
        "questions": len(sizes),
        "sessions_min": min(sizes, default=0),
        "sessions_max": max(sizes, default=0),
        "bytes": target.stat().st_size,
    }
