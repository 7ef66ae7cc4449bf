"""Retrieval over one episode's facts: dense (FAISS), lexical (BM25 via ``rank_bm25``) and their fusion.

Every retriever returns ``(fact_id, score)`` pairs (:data:`~memrl.memory.store.Ranked`), higher = better, best
first. ``hybrid`` is weighted reciprocal-rank fusion (RRF) of the dense and BM25 rankings: rank-based, so the two
score scales never need calibrating. What happens to a ranking next (time expressions, superseded facts,
passages) is :func:`memrl.memory.rescore.rescore`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from rank_bm25 import BM25Okapi

from memrl.memory.config import MemoryConfig
from memrl.memory.stopwords import QUERY_STOP_WORDS
from memrl.memory.store import CANDIDATE_POOL, FactStore, Ranked
from memrl.registry import Registry

# BM25's term saturation (the usual 1.5) and a weaker length normalisation than the usual 0.75: a long turn is
# not less relevant (memrl bench memory on LoCoMo).
BM25_K1, BM25_B = 1.5, 0.5
# Reciprocal-rank fusion's k: 10 trusts the top of each ranking more than the usual 60 (better on LoCoMo).
RRF_K = 10.0

# Hybrid fusion weights: MiniLM alone is weaker than BM25 on dialogue, so its ranking counts half.
DENSE_WEIGHT, BM25_WEIGHT = 0.5, 1.0

_TOKEN = re.compile(r"[a-z0-9]+")


@functools.lru_cache(maxsize=200_000)
def _porter(tok: str) -> str:
    from nltk.stem import PorterStemmer

    return _STEMMER.setdefault("porter", PorterStemmer()).stem(tok)


_STEMMER: dict = {}


def tokenize_stemmed(text: str) -> list[str]:
    """Lower-cased alphanumeric tokens without stop words, Porter-stemmed (``went``≠``go``, but ``painting``→``paint``;
    stemming beat plural stripping on LoCoMo)."""
    return [_porter(t) for t in _TOKEN.findall(text.lower()) if t not in QUERY_STOP_WORDS]


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
        self.dense = DenseRetriever()
        self.bm25 = Bm25Retriever(cfg)

    def rank(self, store: FactStore, query: Query, k: int) -> Ranked:
        pool = max(k, CANDIDATE_POOL)
        return rrf(
            [
                (self.dense.rank(store, query, pool), DENSE_WEIGHT),
                (self.bm25.rank(store, query, pool), BM25_WEIGHT),
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
