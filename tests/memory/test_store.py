"""Every FactStore implementation × index kind against the written contract, on real FAISS + real MiniLM."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from memrl.memory.config import MemoryConfig
from memrl.memory.store import FACT_STORES, FactStoreError, NewFact

SENTENCES = [
    "Ann adopted a dog named Rex.",
    "Ann works as a nurse in Oslo.",
    "Bob is learning to play the violin.",
    "Bob's sister moved to Madrid last year.",
    "Ann ran a marathon in April.",
    "Bob hates spicy food.",
]
KINDS = [(store, index) for store in FACT_STORES.names() for index in ("flat", "hnsw", "ivf")]


@pytest.fixture(scope="module")
def vecs(minilm):
    return minilm.encode(SENTENCES)


def make(store: str, index: str):
    return FACT_STORES.get(store)(MemoryConfig(store=store, index=index), 384)


def fill(store, vecs, namespace="ep1"):
    facts = [
        NewFact(
            text=s, speaker=s.split()[0], timestamp="1 May 2023", source_ids=(f"D1:{i}",), turn_id=f"D1:{i}"
        )
        for i, s in enumerate(SENTENCES)
    ]
    return store.add(namespace, facts, vecs)


@pytest.mark.parametrize("store_name,index", KINDS)
def test_search_returns_similarities_higher_is_closer(store_name, index, vecs, minilm):
    store = make(store_name, index)
    ids = fill(store, vecs)
    query = minilm.encode(["Which pet does Ann have?"])
    hits = store.search("ep1", query, k=len(SENTENCES))[0]
    scores = [s for _, s in hits]
    assert scores == sorted(scores, reverse=True), "best first"
    # The score IS the cosine similarity (not a distance): compare to the exact dot products.
    exact = {fid: float(vecs[fid - ids[0]] @ query[0]) for fid in ids}
    for fid, score in hits:
        assert score == pytest.approx(exact[fid], abs=1e-4)
    assert hits[0][0] == ids[0]  # the dog fact
    # A stored vector is its own nearest neighbour with similarity ~1.
    self_hit = store.search("ep1", vecs[2:3], k=1)[0][0]
    assert self_hit[0] == ids[2] and self_hit[1] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize("store_name,index", KINDS)
def test_update_keeps_id_and_changes_search(store_name, index, vecs, minilm):
    store = make(store_name, index)
    ids = fill(store, vecs)
    store.search("ep1", vecs[:1], 1)  # build the index before mutating (exercises incremental paths)
    new_text = "Ann gave Rex away and adopted a cat named Miso."
    rec = store.update(
        "ep1", ids[0], new_text, minilm.encode([new_text])[0], "D2:1", source_ids=("D1:0", "D2:1")
    )
    assert (
        rec.fact_id == ids[0]
        and rec.text == new_text
        and rec.updated_turn == "D2:1"
        and rec.created_turn == "D1:0"
    )
    top = store.search("ep1", minilm.encode(["Ann's cat"]), 1)[0][0]
    assert top[0] == ids[0]
    assert store.get("ep1", ids[0]).source_ids == ("D1:0", "D2:1")
    assert len(store.records("ep1")) == len(SENTENCES)  # update never duplicates


@pytest.mark.parametrize("store_name,index", KINDS)
def test_delete_removes_from_search_and_ids_are_never_reused(store_name, index, vecs):
    store = make(store_name, index)
    ids = fill(store, vecs)
    store.search("ep1", vecs[:1], 1)
    store.delete("ep1", [ids[1], ids[3]])
    found = {fid for fid, _ in store.search("ep1", vecs, k=10)[0]}
    assert found == set(ids) - {ids[1], ids[3]}
    assert [r.fact_id for r in store.records("ep1")] == [i for i in ids if i not in (ids[1], ids[3])]
    with pytest.raises(FactStoreError, match=f"no fact id {ids[1]}"):
        store.get("ep1", ids[1])
    with pytest.raises(FactStoreError):
        store.delete("ep1", [ids[1]])
    more = store.add("ep1", [NewFact("x")], vecs[:1])
    assert more[0] > max(ids)


@pytest.mark.parametrize("store_name,index", KINDS)
def test_copy_namespace_gives_the_same_facts_under_new_ids(store_name, index, vecs):
    store = make(store_name, index)
    ids = fill(store, vecs, "leader")
    store.delete("leader", [ids[1]])
    store.search("leader", vecs[:1], 2)  # an index already built must not be shared
    copied = store.copy_namespace("leader", "copy")
    assert list(copied) == [i for i in ids if i != ids[1]] and not set(copied.values()) & set(ids)
    strip = lambda r: (r.text, r.speaker, r.timestamp, r.source_ids, r.created_turn)  # noqa: E731
    assert [strip(r) for r in store.records("copy")] == [strip(r) for r in store.records("leader")]
    hits = lambda ns: [(f, round(s, 4)) for f, s in store.search(ns, vecs, k=4)[0]]  # noqa: E731
    assert hits("copy") == [(copied[f], s) for f, s in hits("leader")]
    store.add("copy", [NewFact("Only in the copy.")], vecs[:1])  # the two stay isolated afterwards
    assert len(store.records("leader")) == len(SENTENCES) - 1
    with pytest.raises(FactStoreError, match="already exists"):
        store.copy_namespace("leader", "copy")
    assert store.copy_namespace("never-seen", "empty") == {}


@pytest.mark.parametrize("store_name,index", KINDS)
def test_a_copy_keeps_each_superseded_fact_pointing_at_its_own_successor(store_name, index, vecs):
    store = make(store_name, index)
    ids = fill(store, vecs, "leader")
    old, new = ids[0], ids[1]
    store.update("leader", old, store.get("leader", old).text, vecs[:1], "D2:1",
                 extra={"superseded_by": new, "valid_until": "D2:1"})  # fmt: skip
    copied = store.copy_namespace("leader", "copy")
    assert store.get("copy", copied[old]).extra["superseded_by"] == copied[new]
    assert store.get("leader", old).extra["superseded_by"] == new  # the source is left as it was


@pytest.mark.parametrize("store_name,index", KINDS)
def test_namespaces_are_isolated(store_name, index, vecs):
    store = make(store_name, index)
    a = fill(store, vecs, "episode-a")
    b = store.add("episode-b", [NewFact("Bob hates spicy food.")], vecs[5:6])
    assert not set(a) & set(b)
    assert {f for f, _ in store.search("episode-b", vecs, k=10)[0]} == set(b)
    assert {f for f, _ in store.search("episode-a", vecs[5:6], k=10)[0]} == set(a)
    with pytest.raises(FactStoreError, match="episode-b"):
        store.get("episode-b", a[0])
    assert store.search("never-seen", vecs[:1], 3) == [[]]
    store.drop_namespace("episode-a")
    assert store.namespaces() == ["episode-b"]


def test_bad_vectors_are_rejected(vecs):
    store = make("faiss", "flat")
    with pytest.raises(FactStoreError, match=r"expected vectors of shape \(1, 384\)"):
        store.add("ep", [NewFact("a")], vecs[:2])
    bad = vecs[:1].copy()
    bad[0, 0] = np.nan
    with pytest.raises(FactStoreError, match="NaN"):
        store.add("ep", [NewFact("a")], bad)


@pytest.mark.parametrize("index", ["flat", "hnsw"])
def test_save_load_roundtrip(tmp_path, vecs, index):
    store = make("faiss", index)
    ids = fill(store, vecs, "a")
    store.add("b", [NewFact("Bob hates spicy food.", source_ids=("S:1",))], vecs[5:6])
    store.delete("a", [ids[0]])
    path = tmp_path / "facts.memrl"
    store.save(str(path))
    loaded = type(store).load(str(path), store.cfg)
    assert loaded.records("a") == store.records("a") and loaded.records("b") == store.records("b")
    assert loaded.search("a", vecs, 3) == store.search("a", vecs, 3)
    assert loaded.add("a", [NewFact("new")], vecs[:1])[0] > max(ids) + 1  # id counter persisted


def test_crash_during_replace_keeps_previous_store(tmp_path, vecs, monkeypatch):
    path = tmp_path / "facts.memrl"
    store = make("faiss", "flat")
    fill(store, vecs, "a")
    store.save(str(path))
    before = path.read_bytes()
    store.add("a", [NewFact("one more fact")], vecs[:1])

    def crash(*args, **kwargs):
        raise OSError("simulated power loss during rename")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated"):
        store.save(str(path))
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert list(tmp_path.iterdir()) == [path]  # the temp file is cleaned up
    assert len(type(store).load(str(path), store.cfg).records("a")) == len(SENTENCES)


def test_process_killed_mid_save_leaves_previous_store(tmp_path, vecs):
    """A child process dies (os._exit, no cleanup) after writing the temp file, before the rename."""
    path = tmp_path / "facts.memrl"
    store = make("faiss", "flat")
    fill(store, vecs, "a")
    store.save(str(path))
    before = path.read_bytes()
    script = textwrap.dedent(f"""
        import os, numpy as np
        from memrl.memory.config import MemoryConfig
        from memrl.memory.store import FaissFactStore, NewFact
        store = FaissFactStore.load({str(path)!r}, MemoryConfig())
        store.add("a", [NewFact("written by the doomed process")], np.eye(1, 384, dtype="float32"))
        os.replace = lambda *a, **k: os._exit(9)   # die exactly between fsync and rename
        store.save({str(path)!r})
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == 9, proc.stderr.decode()[-2000:]
    assert path.read_bytes() == before
    loaded = type(store).load(str(path), store.cfg)
    assert all("doomed" not in r.text for r in loaded.records("a"))


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda b: b[:-40], "checksum"),
        (lambda b: b[:100] + bytes([b[100] ^ 0xFF]) + b[101:], "checksum"),
        (lambda b: b"not a store at all, just text" * 3, "MEMRLFS1"),
        (lambda b: b"", "MEMRLFS1"),
    ],
    ids=["truncated", "bitflip", "foreign", "empty"],
)
def test_corrupt_file_raises_clear_error(tmp_path, vecs, damage, match):
    path = tmp_path / "facts.memrl"
    store = make("faiss", "flat")
    fill(store, vecs, "a")
    store.save(str(path))
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(FactStoreError, match=match) as err:
        type(store).load(str(path), store.cfg)
    assert str(path) in str(err.value)


def test_missing_file_raises(tmp_path):
    with pytest.raises(FactStoreError, match="does not exist"):
        FACT_STORES.get("faiss")  # registry lookup works
        make("faiss", "flat").load(str(tmp_path / "nope"), MemoryConfig())
