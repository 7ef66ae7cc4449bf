"""Texts longer than the embedder's window are chunked, stored as several vectors and scored by their best chunk."""

from __future__ import annotations

import numpy as np
import pytest

from memrl.memory.config import MemoryConfig
from memrl.memory.embed_cache import CachedEmbedder
from memrl.memory.embedder import CHUNK_OVERLAP, split_by_offsets, window_chunks
from memrl.memory.manager import MemorySystem
from memrl.memory.store import FACT_STORES, FactStoreError, NewFact
from memrl.types import TurnSpec
from tests.memory.conftest import CountingEmbedder

FILLER = " ".join(
    f"On day {i} the weather report for the coastal town mentioned light rain, mild winds and a cloudy sky."
    for i in range(40)
)
NEEDLE = "By the way, my sister's cat is named Pumpernickel and it only eats salmon."
LONG = f"{FILLER} {NEEDLE}"


def _words(text: str) -> list[str]:
    return text.split()


def test_split_by_offsets_windows_overlap_and_cover_the_text():
    text = " ".join(f"w{i}" for i in range(25))
    offsets, pos = [], 0
    for w in text.split():
        offsets.append((pos, pos + len(w)))
        pos += len(w) + 1
    pieces = split_by_offsets(text, offsets, window=10, overlap=3)
    assert [len(p.split()) for p in pieces] == [10, 10, 10, 4]  # starts 0, 7, 14, 21
    assert pieces[0].split()[-3:] == pieces[1].split()[:3]  # 3 shared tokens
    assert pieces[-1].split()[-1] == "w24"
    assert split_by_offsets("a b", [(0, 1), (2, 3)], window=10, overlap=3) == ["a b"]


def test_minilm_splits_by_its_own_tokenizer(minilm):
    short, long = window_chunks(minilm, ["a short turn", LONG])
    assert short == ["a short turn"]
    assert minilm.count_tokens([LONG])[0] > minilm.window and len(long) >= 3
    assert all(n <= minilm.window for n in minilm.count_tokens(long))
    assert long[-1].endswith("salmon.")
    joined = set(_words(" ".join(long)))
    assert set(_words(LONG)) <= joined  # nothing dropped
    assert CHUNK_OVERLAP >= 16 and long[0][-20:] in long[1]  # consecutive windows overlap


def test_text_beyond_the_window_is_retrievable(minilm):
    cfg = MemoryConfig(retrieval="dense", neighbour_turns=0)
    system = MemorySystem(cfg, embedder=minilm)
    mgr = system.manager("ep")
    texts = [LONG, "I bought a new road bike in May.", "The budget meeting is on Monday.", FILLER[:400]]
    system.extract_facts_batch([(mgr, TurnSpec("history", t, f"S:{i}", "user")) for i, t in enumerate(texts)])
    query = "What is the name of my sister's cat?"
    (top, *_) = mgr.retrieve(query, k=4)
    assert top.source_ids == ("S:0",) and top.text == f"user: {LONG}"
    # The fact's score is its best chunk's cosine (the needle's window), far above the truncated text's. The
    # needle still shares its window with ~200 tokens of weather talk: a chunk dilutes, it does not isolate.
    q = minilm.encode([query])[0]
    chunks = minilm.encode(window_chunks(minilm, [LONG])[0])
    assert top.score == pytest.approx(float((chunks @ q).max()), abs=1e-4)
    assert top.score > float(chunks[0] @ q) + 0.1


def test_store_keeps_every_chunk_and_scores_a_fact_once_by_its_best(minilm, tmp_path):
    store = FACT_STORES.get("faiss")(MemoryConfig(), minilm.dim)
    a, b, c = minilm.encode(
        ["Ann adopted a dog named Rex.", "The budget meeting is on Monday.", "Bob sings."]
    )
    fid, other = store.add("ep", [NewFact("long fact"), NewFact("short fact")], [np.stack([b, a]), c[None]])
    hits = store.search("ep", a[None], k=2)[0]
    assert [h[0] for h in hits] == [fid, other] and hits[0][1] == pytest.approx(1.0, abs=1e-4)
    assert store.chunk_vectors("ep", fid).shape == (2, minilm.dim)
    np.testing.assert_array_equal(store.vectors("ep", [fid])[0], b)  # the leading chunk
    path = tmp_path / "s.memrl"
    store.save(str(path))
    loaded = type(store).load(str(path), store.cfg)
    assert loaded.search("ep", a[None], k=2) == store.search("ep", a[None], k=2)
    np.testing.assert_array_equal(loaded.chunk_vectors("ep", fid), store.chunk_vectors("ep", fid))
    store.update("ep", fid, "now short", c, "T:1")  # one vector replaces both chunks
    assert store.chunk_vectors("ep", fid).shape == (1, minilm.dim)
    assert store.search("ep", a[None], k=2)[0][0][1] < 0.9
    store.delete("ep", [fid])
    assert [h[0] for h in store.search("ep", a[None], k=5)[0]] == [other]
    with pytest.raises(FactStoreError, match="n_chunks"):
        store.add("ep", [NewFact("x")], [np.zeros((0, minilm.dim), np.float32)])


def test_the_embedding_cache_is_keyed_per_chunk(minilm, tmp_path):
    inner = CountingEmbedder(minilm)
    cached = CachedEmbedder(inner, tmp_path / "e.sqlite")
    n_chunks = len(window_chunks(cached, [LONG])[0])
    system = MemorySystem(MemoryConfig(neighbour_turns=0), embedder=cached)
    turn = TurnSpec("history", LONG, "S:0", "user")
    system.extract_facts_batch([(system.manager("a"), turn)])
    assert inner.calls == [n_chunks] and cached.misses == n_chunks
    system.extract_facts_batch([(system.manager("b"), turn)])  # same text in another haystack
    assert inner.calls == [n_chunks] and cached.hits == n_chunks
