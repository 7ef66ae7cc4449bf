"""Dense / BM25 / hybrid retrieval and reciprocal-rank fusion on real MiniLM + FAISS."""

from __future__ import annotations

import pytest

from memrl.memory.config import MemoryConfig
from memrl.memory.manager import MemorySystem
from memrl.memory.retrieval import RETRIEVERS, rrf, tokenize_stemmed
from memrl.types import MemoryOpType, TurnSpec

HISTORY = [
    ("D1:1", "Ann", "8 May 2023", "I adopted a puppy yesterday, he is so fluffy."),
    ("D1:2", "Bob", "8 May 2023", "Congrats! What did you name him?"),
    ("D1:3", "Ann", "8 May 2023", "His name is Zorblax, after a cartoon."),
    ("D2:1", "Bob", "20 June 2024", "I started a new job as a carpenter."),
    ("D2:2", "Ann", "20 June 2024", "I'm training for the Bergen marathon."),
    ("D2:3", "Bob", "20 June 2024", "Currently I am reading a novel about pirates."),
]


@pytest.fixture(scope="module")
def system(minilm):
    """One system per retrieval mode over the same history (one encode call each)."""
    systems = {}
    for mode in ("dense", "bm25", "hybrid"):
        s = MemorySystem(MemoryConfig(retrieval=mode, top_k=3, neighbour_turns=0), embedder=minilm)
        s.extract_facts_batch(
            [(s.manager("ep"), TurnSpec("history", x, i, sp, ts)) for i, sp, ts, x in HISTORY]
        )
        systems[mode] = s
    return systems


def test_tokenize_drops_stopwords_and_stems():
    assert tokenize_stemmed("What did the dogs eat in 2023?") == ["dog", "eat", "2023"]
    assert tokenize_stemmed("Painting the paintings") == ["paint", "paint"]


def test_rrf_fuses_by_rank():
    fused = rrf([([(1, 9.0), (2, 8.0)], 1.0), ([(2, 0.5), (3, 0.1)], 1.0)], rrf_k=60, k=3)
    assert [f for f, _ in fused] == [2, 1, 3]
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)


def test_bm25_finds_rare_token_dense_finds_paraphrase(system):
    bm25 = system["bm25"].manager("ep").retrieve("Zorblax", k=1)
    assert bm25[0].source_ids == ("D1:3",)
    dense = system["dense"].manager("ep").retrieve("Which pet did Ann get?", k=1)
    assert dense[0].source_ids == ("D1:1",)
    # hybrid gets both right
    assert system["hybrid"].manager("ep").retrieve("Zorblax", k=1)[0].source_ids == ("D1:3",)
    assert system["hybrid"].manager("ep").retrieve("Which pet did Ann get?", k=1)[0].source_ids == ("D1:1",)


def test_scores_descend_and_retrieve_is_logged(system):
    mgr = system["hybrid"].manager("ep")
    hits = mgr.retrieve("What job did Bob start?", k=3, turn_id="Q")
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert (
        hits[0].source_ids == ("D2:1",) and hits[0].timestamp == "20 June 2024" and hits[0].speaker == "Bob"
    )
    op = mgr.memory_ops[-1]
    assert (
        op.op is MemoryOpType.RETRIEVE and op.turn_id == "Q" and op.fact_ids == tuple(h.fact_id for h in hits)
    )
    assert op.text == "What job did Bob start?" and op.scores == tuple(h.score for h in hits)


def test_neighbour_expansion_attaches_adjacent_turns(minilm):
    s = MemorySystem(MemoryConfig(retrieval="bm25", neighbour_turns=1, top_k=2), embedder=minilm)
    s.extract_facts_batch([(s.manager("ep"), TurnSpec("history", x, i, sp, ts)) for i, sp, ts, x in HISTORY])
    hits = s.manager("ep").retrieve("Zorblax cartoon", k=1)
    assert hits[0].source_ids == ("D1:2", "D1:3", "D2:1")
    assert hits[0].text.split(" | ") == [
        "Bob: Congrats! What did you name him?",
        "Ann: His name is Zorblax, after a cartoon.",
        "Bob: I started a new job as a carpenter.",
    ]
    # Overlapping windows never repeat a fact: the second hit carries only what the first did not.
    two = s.manager("ep").retrieve("Zorblax name him", k=2)
    ids = [sid for h in two for sid in h.source_ids]
    assert len(ids) == len(set(ids))


def test_unknown_retriever_lists_choices():
    with pytest.raises(KeyError, match="bm25, dense, hybrid"):
        RETRIEVERS.get("sparse")
