"""Retrieval over one episode's facts: dense (FAISS), lexical (BM25 via ``rank_bm25``) and their fusion.

Every retriever returns ``(fact_id, score)`` pairs, higher = better, best first. ``hybrid`` is weighted
reciprocal-rank fusion (RRF) of the dense and BM25 rankings — rank-based, so the two score scales never need
calibrating. Optional time-aware scoring adds a bonus to facts dated in a period the query names (``in May
2023``, ``2022``) and a recency bonus for "latest/currently"-style queries.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from rank_bm25 import BM25Okapi

from memrl.memory.config import MemoryConfig
from memrl.memory.store import FactRecord, FactStore
from memrl.registry import Registry

Ranked = list[tuple[int, float]]

# BM25's term saturation (the usual 1.5) and a weaker length normalisation than the usual 0.75: a long turn is
# not less relevant (memrl bench memory on LoCoMo).
BM25_K1, BM25_B = 1.5, 0.5
# Reciprocal-rank fusion's k: 10 trusts the top of each ranking more than the usual 60 (better on LoCoMo).
RRF_K = 10.0

_TOKEN = re.compile(r"[a-z0-9]+")
# Function words: BM25 would otherwise reward matching "the"/"did" in long turns.
_STOP = frozenset(
    [
        "a",
        "about",
        "after",
        "again",
        "all",
        "am",
        "an",
        "and",
        "any",
        "are",
        "as",
        "at",
        "be",
        "been",
        "before",
        "being",
        "both",
        "but",
        "by",
        "can",
        "could",
        "did",
        "do",
        "does",
        "doing",
        "down",
        "during",
        "each",
        "for",
        "from",
        "further",
        "had",
        "has",
        "have",
        "having",
        "he",
        "her",
        "here",
        "hers",
        "herself",
        "him",
        "himself",
        "his",
        "how",
        "i",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "itself",
        "just",
        "me",
        "more",
        "most",
        "my",
        "myself",
        "no",
        "nor",
        "not",
        "now",
        "of",
        "off",
        "on",
        "once",
        "only",
        "or",
        "other",
        "our",
        "ours",
        "out",
        "over",
        "own",
        "same",
        "she",
        "should",
        "so",
        "some",
        "such",
        "than",
        "that",
        "the",
        "their",
        "theirs",
        "them",
        "then",
        "there",
        "these",
        "they",
        "this",
        "those",
        "through",
        "to",
        "too",
        "under",
        "until",
        "up",
        "very",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "while",
        "who",
        "whom",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
        "yours",
        "yourself",
    ]
)
_MONTHS = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
]
_YEAR = re.compile(r"\b(19|20)\d{2}\b")


@functools.lru_cache(maxsize=200_000)
def _porter(tok: str) -> str:
    from nltk.stem import PorterStemmer

    return _STEMMER.setdefault("porter", PorterStemmer()).stem(tok)


_STEMMER: dict = {}


def tokenize_stemmed(text: str) -> list[str]:
    """Lower-cased alphanumeric tokens without stop words, Porter-stemmed (``went``≠``go``, but ``painting``→``paint``;
    stemming beat plural stripping on LoCoMo)."""
    return [_porter(t) for t in _TOKEN.findall(text.lower()) if t not in _STOP]


@dataclass(frozen=True)
class Query:
    """One retrieval request: ``vector`` is the embedded query ``[dim]`` (None for lexical-only retrievers)."""

    namespace: str
    text: str
    vector: np.ndarray | None = None


class Retriever(Protocol):
    needs_vectors: bool

    def rank(self, store: FactStore, query: Query, k: int) -> Ranked: ...


RetrieverFactory = Callable[[MemoryConfig], Retriever]
RETRIEVERS: Registry[RetrieverFactory] = Registry("retriever")


class DenseRetriever:
    needs_vectors = True

    def rank(self, store: FactStore, query: Query, k: int) -> Ranked:
        if query.vector is None:
            raise ValueError("dense retrieval needs the query vector")
        return store.search(query.namespace, query.vector.reshape(1, -1), k)[0]


class Bm25Retriever:
    """BM25Okapi per namespace, rebuilt when the namespace's revision changes (lazily, at query time)."""

    needs_vectors = False

    def __init__(self, cfg: MemoryConfig) -> None:
        self.tokenize = tokenize_stemmed
        self._cache: dict[str, tuple[int, list[int], BM25Okapi | None, frozenset[str]]] = {}

    def _index(self, store: FactStore, namespace: str) -> tuple[list[int], BM25Okapi | None, frozenset[str]]:
        rev = store.revision(namespace)
        hit = self._cache.get(namespace)
        if hit and hit[0] == rev:
            return hit[1], hit[2], hit[3]
        records = store.records(namespace)
        ids = [r.fact_id for r in records]
        docs = [self.tokenize(r.text) for r in records]
        # BM25Okapi divides by the corpus size; an empty namespace has no index.
        bm25 = BM25Okapi(docs, k1=BM25_K1, b=BM25_B) if docs else None
        speakers = frozenset(self.tokenize(" ".join({r.speaker for r in records if r.speaker})))
        self._cache[namespace] = (rev, ids, bm25, speakers)
        return ids, bm25, speakers

    def rank(self, store: FactStore, query: Query, k: int) -> Ranked:
        ids, bm25, speakers = self._index(store, query.namespace)
        if bm25 is None:
            return []
        # Speaker names match half of all facts (every "Name: ..." prefix): they are dropped from the lexical
        # query (keeping them was worse on LoCoMo).
        q = [t for t in self.tokenize(query.text) if t not in speakers] or self.tokenize(query.text)
        scores = bm25.get_scores(q)
        top = np.argsort(-scores, kind="stable")[:k]
        return [(ids[i], float(scores[i])) for i in top if scores[i] > 0]


def rrf(rankings: Sequence[tuple[Ranked, float]], rrf_k: float, k: int) -> Ranked:
    """Weighted reciprocal-rank fusion: ``score(d) = sum_r w_r / (rrf_k + rank_r(d))`` (rank from 1)."""
    fused: dict[int, float] = {}
    for ranked, weight in rankings:
        for rank, (fid, _) in enumerate(ranked, start=1):
            fused[fid] = fused.get(fid, 0.0) + weight / (rrf_k + rank)
    return sorted(fused.items(), key=lambda kv: -kv[1])[:k]


class HybridRetriever:
    needs_vectors = True

    def __init__(self, cfg: MemoryConfig) -> None:
        self.cfg = cfg
        self.dense = DenseRetriever()
        self.bm25 = Bm25Retriever(cfg)

    def rank(self, store: FactStore, query: Query, k: int) -> Ranked:
        pool = max(k, self.cfg.candidate_pool)
        return rrf(
            [
                (self.dense.rank(store, query, pool), self.cfg.dense_weight),
                (self.bm25.rank(store, query, pool), self.cfg.bm25_weight),
            ],
            RRF_K,
            pool,
        )


@RETRIEVERS.register("dense")
def _dense(cfg: MemoryConfig) -> Retriever:
    return DenseRetriever()


@RETRIEVERS.register("bm25")
def _bm25(cfg: MemoryConfig) -> Retriever:
    return Bm25Retriever(cfg)


@RETRIEVERS.register("hybrid")
def _hybrid(cfg: MemoryConfig) -> Retriever:
    return HybridRetriever(cfg)


# ---------------------------------------------------------------------------------------------------------
# Time-aware re-scoring


def query_periods(text: str) -> tuple[set[str], set[str]]:
    """Years and month names a query mentions (lower-cased)."""
    low = text.lower()
    years = {m.group(0) for m in _YEAR.finditer(low)}
    months = {m for m in _MONTHS if re.search(rf"\b{m}\b", low)}
    return years, months


_NUMBERS = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
_COUNT = {"a": 1, "an": 1, **{w: i for i, w in enumerate(_NUMBERS, start=1)}}
_UNIT_DAYS = {"day": 1, "week": 7, "month": 30, "year": 365}
_COUNT_RE = rf"(a|an|{'|'.join(_NUMBERS)}|\d+)"
_AGO = re.compile(rf"\b{_COUNT_RE}\s+(day|week|month|year)s?\s+ago\b")  # "two weeks ago"
_SPAN = re.compile(
    rf"\b(?:last|past|previous)\s+(?:{_COUNT_RE}\s+)?(day|week|month|year)s?\b"
)  # "past 3 months"
# Dates as the adapters write them: LongMemEval "2023/05/21 (Sun) 19:50", LoCoMo "1:56 pm on 8 May, 2023".
_DATE_FORMATS = (
    (re.compile(r"\d{4}/\d{1,2}/\d{1,2}"), "%Y/%m/%d"),
    (re.compile(r"\d{1,2} [A-Za-z]+,? \d{4}"), "%d %B %Y"),
    (re.compile(r"\d{4}-\d{2}-\d{2}"), "%Y-%m-%d"),
)


# In-range facts are worth 1.5x: a boost in proportion to relevance. LongMemEval _S-like build (60 questions, 5
# with a relative time): session recall@10 0.973 -> 0.979 (the "past three months" trips question finds its third
# trip). An additive bonus of time_weight (0.05, as for named months) instead lifted every in-range filler
# session to the top and lost 0.005 ("a month ago": the out-of-range events the question lists as evidence).
RANGE_BOOST = 0.5


def parse_date(stamp: str | None) -> dt.date | None:
    """The calendar date in a timestamp string, or None when it has none that memrl reads."""
    for pattern, fmt in _DATE_FORMATS:
        m = pattern.search(stamp or "")
        if m:
            try:
                return dt.datetime.strptime(m.group(0).replace(",", ""), fmt).date()
            except ValueError:
                continue
    return None


def _count(word: str | None) -> int:
    return 1 if word is None else int(word) if word.isdigit() else _COUNT[word]


def relative_period(query: str, asked_at: str | None) -> tuple[dt.date, dt.date] | None:
    """The date range a question's relative time names, from the date it was asked: "two weeks ago" is the
    week around 14 days before (a span's quarter on each side, at least two days), "in the past three months"
    / "last month" the 90 / 30 days before. None when the question names none or its date is unknown."""
    asked = parse_date(asked_at)
    if asked is None:
        return None
    low = query.lower()
    m = _AGO.search(low)
    if m:
        days = _count(m.group(1)) * _UNIT_DAYS[m.group(2)]
        slack = dt.timedelta(days=max(2, days // 4))
        centre = asked - dt.timedelta(days=days)
        return centre - slack, min(asked, centre + slack)
    m = _SPAN.search(low)
    if m:
        return asked - dt.timedelta(days=_count(m.group(1)) * _UNIT_DAYS[m.group(2)]), asked
    return None


def time_rescore(
    ranked: Ranked, records: dict[int, FactRecord], query: str, cfg: MemoryConfig, asked_at: str | None = None
) -> Ranked:
    """Multiply the fused score of facts dated in the range the query's relative time names from ``asked_at``
    by ``1 + RANGE_BOOST``; add ``time_weight`` × (dated in the year/month the query names). ``time_weight = 0``
    turns both off. Scores stay "higher = better"."""
    if not ranked or cfg.time_weight == 0:
        return ranked
    years, months = query_periods(query)
    period = relative_period(query, asked_at)
    out = []
    for fid, score in ranked:
        rec = records[fid]
        stamp = (rec.timestamp or "").lower()
        bonus = 0.0
        if (years or months) and stamp:
            hit_year = not years or any(y in stamp for y in years)
            hit_month = not months or any(m in stamp for m in months)
            bonus += cfg.time_weight * float(hit_year and hit_month)
        if period is not None:
            day = parse_date(rec.timestamp)
            if day is not None and period[0] <= day <= period[1]:
                score *= 1.0 + RANGE_BOOST
        out.append((fid, score + bonus))
    return sorted(out, key=lambda kv: -kv[1])


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


def supersede_rescore(ranked: Ranked, records: dict[int, FactRecord], query: str, weight: float) -> Ranked:
    """Facts an UPDATE superseded (``extra["superseded_by"]``), for a query that does not ask about the past:
    one whose current successor is also a candidate is dropped, the others' scores are multiplied by
    ``weight``. The current value answers "where does Mia live?"; the old one stays findable for "where did Mia
    live before?" (validity intervals, as Zep's facts carry). Dropped, not only ranked lower: with both values
    in its prompt, even marked "no longer true", SmolLM2-135M answered with the first listed, the older one."""
    if not any(records[f].superseded for f, _ in ranked):
        return ranked
    if _PAST_WORDS & set(_TOKEN.findall(query.lower())):
        return ranked
    candidates = {f for f, _ in ranked}
    out = [
        (f, s * weight if records[f].superseded else s)
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


# Phrases of a question about an earlier value ("Which city did Ann live in before moving?"). Narrower than
# _PAST_WORDS: "old" ("How old is Ann?") and "first" do not ask for a superseded value.
_PAST_QUESTION = re.compile(
    r"\b(before|previously|previous|formerly|former|earlier|originally|prior|used? to|in the past|at first)\b"
)


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
    of that text: a question about the past never asks for the current value of a fact that changed, and
    without it the same answer adapter went 0.50 -> 0.58 lenient on the chats' validation "before" questions.
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
