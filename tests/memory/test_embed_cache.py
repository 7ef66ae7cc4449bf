"""The persistent embedding cache over the real MiniLM: same vectors, each text encoded once, survives a kill."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np

from memrl.memory.embed_cache import CachedEmbedder, cache_file
from tests.memory.conftest import CountingEmbedder

TEXTS = [
    "Caroline went to the LGBTQ support group.",
    "Melanie painted a sunrise.",
    "The dog is called Noodle.",
]


def _raw_minilm():
    from memrl.memory.config import MemoryConfig
    from memrl.memory.embedder import build_embedder

    return build_embedder(MemoryConfig(embedding_cache=False, embedder_dtype="float32"))


def test_vectors_match_the_encoder_and_each_text_is_encoded_once(tmp_path):
    inner = CountingEmbedder(_raw_minilm())
    cached = CachedEmbedder(inner, tmp_path / "e.sqlite")
    first = cached.encode([*TEXTS, TEXTS[0]])  # a repeat inside one call is encoded once
    assert inner.calls == [3] and (cached.hits, cached.misses) == (1, 3)
    assert np.allclose(first[:3], inner.inner.encode(TEXTS), atol=1e-5) and np.array_equal(first[0], first[3])
    again = CachedEmbedder(CountingEmbedder(inner.inner), tmp_path / "e.sqlite")  # another run, same file
    assert np.array_equal(again.encode(TEXTS[::-1]), first[:3][::-1])
    assert again.inner.calls == [] and again.stats()["memory/embed_cache_hit_rate"] == 1.0
    assert cached.encode([]).shape == (0, cached.dim)


def test_cache_files_are_per_model_dtype_and_dimension(tmp_path):
    a = cache_file(tmp_path, "/models/a/model", "float32", 384)
    assert a != cache_file(tmp_path, "/models/b/model", "float32", 384)  # same tail, other model
    assert a != cache_file(tmp_path, "/models/a/model", "bfloat16", 384)
    assert a.parent == tmp_path / "embeddings" and a.name.endswith("-float32-d384.sqlite")


def test_a_killed_ingest_resumes_without_re_encoding_what_was_cached(tmp_path):
    """A process encodes a first batch, commits it and is SIGKILLed; the next run encodes only the new texts."""
    path = tmp_path / "e.sqlite"
    child = textwrap.dedent(
        f"""
        import os, signal
        from tests.memory.test_embed_cache import _raw_minilm, TEXTS
        from memrl.memory.embed_cache import CachedEmbedder
        CachedEmbedder(_raw_minilm(), {str(path)!r}).encode(TEXTS[:2])
        os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=300)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    inner = CountingEmbedder(_raw_minilm())
    resumed = CachedEmbedder(inner, path)
    resumed.encode(TEXTS)
    assert inner.calls == [1] and (resumed.hits, resumed.misses) == (2, 1)


def test_a_call_that_dies_mid_way_keeps_the_slices_it_finished(tmp_path, monkeypatch):
    """One encode call over a whole haystack commits slice by slice: a crash keeps the finished slices."""
    import pytest

    from memrl.memory import embed_cache

    monkeypatch.setattr(embed_cache, "COMMIT_EVERY", 2)

    class DiesOnSecondCall(CountingEmbedder):
        def encode(self, texts):
            if self.calls:
                raise RuntimeError("killed")
            return super().encode(texts)

    with pytest.raises(RuntimeError, match="killed"):
        CachedEmbedder(DiesOnSecondCall(_raw_minilm()), tmp_path / "e.sqlite").encode(TEXTS)
    inner = CountingEmbedder(_raw_minilm())
    resumed = CachedEmbedder(inner, tmp_path / "e.sqlite")
    resumed.encode(TEXTS)
    assert inner.calls == [1] and (resumed.hits, resumed.misses) == (2, 1)


def _rows(path) -> int:
    import sqlite3

    with sqlite3.connect(path) as db:
        return db.execute("SELECT COUNT(*) FROM vectors").fetchone()[0]


def test_a_full_disk_stops_writes_with_one_warning_and_the_run_goes_on(tmp_path, caplog):
    """SQLite's own page limit makes the real INSERT fail with SQLITE_FULL ("database or disk is full")."""
    path = tmp_path / "e.sqlite"
    raw = _raw_minilm()
    cached = CachedEmbedder(raw, path)
    cached.encode(TEXTS[:1])
    (pages,) = cached._blobs._db.execute("PRAGMA page_count").fetchone()
    cached._blobs._db.execute(f"PRAGMA max_page_count = {pages}")  # the file may not grow: as a full disk
    more = [f"Fact number {i} about the garden." for i in range(20)]
    with caplog.at_level("WARNING", logger="memrl.blob_cache"):
        vecs = cached.encode([*TEXTS, *more])
        again = cached.encode([*more, "One more text after the disk filled."])
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and str(path) in warnings[0] and "database or disk is full" in warnings[0]
    assert np.allclose(vecs, raw.encode([*TEXTS, *more]), atol=1e-5)  # equal to the uncached vectors
    assert again.shape == (21, cached.dim)
    assert cached.stats()["memory/embed_cache_writes_stopped"] == 1.0
    assert (cached.hits, cached.misses) == (1, 1 + 22 + 21)  # nothing written after the failure: all misses
    cached.close()
    assert _rows(path) == 1  # what was cached before stays readable
    assert CachedEmbedder(raw, path).stats()["memory/embed_cache_writes_stopped"] == 0.0


def test_a_cache_that_cannot_even_be_created_is_skipped(tmp_path, monkeypatch, caplog):
    import sqlite3

    from memrl import blob_cache

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(blob_cache.sqlite3, "connect", full)
    raw = _raw_minilm()
    with caplog.at_level("WARNING", logger="memrl.blob_cache"):
        cached = CachedEmbedder(raw, tmp_path / "e.sqlite")
        vecs = cached.encode(TEXTS)
    assert np.allclose(vecs, raw.encode(TEXTS), atol=1e-5) and cached.misses == 3
    assert "e.sqlite" in caplog.text and cached.stats()["memory/embed_cache_writes_stopped"] == 1.0


def test_a_really_full_filesystem_warns_and_keeps_the_vectors(small_tmpfs, caplog):
    """On a filled tmpfs SQLite's commit fails with SQLITE_FULL: one warning, same vectors, old rows readable."""
    from tests.conftest import fill_disk

    raw = _raw_minilm()
    cached = CachedEmbedder(raw, small_tmpfs / "e.sqlite")
    cached.encode(TEXTS)
    fill_disk(small_tmpfs)
    more = [f"Fact number {i} about the garden, on a full disk." for i in range(300)]
    with caplog.at_level("WARNING", logger="memrl.blob_cache"):
        vecs = cached.encode([*more, *TEXTS])
    assert "database or disk is full" in caplog.text and str(small_tmpfs / "e.sqlite") in caplog.text
    assert np.allclose(vecs[:300], raw.encode(more), atol=1e-5) and cached.writes_stopped
    assert cached.hits == 3  # what was cached before the disk filled is still read


def test_a_cache_created_on_a_full_filesystem_is_skipped(small_tmpfs, caplog):
    """With a few kB left SQLite cannot map its WAL index and says only "disk I/O error": the space left
    tells that apart from other I/O errors, and the run goes on uncached."""
    from tests.conftest import fill_disk

    fill_disk(small_tmpfs, keep=8192)
    raw = _raw_minilm()
    with caplog.at_level("WARNING", logger="memrl.blob_cache"):
        cached = CachedEmbedder(raw, small_tmpfs / "embeddings" / "e.sqlite")
        vecs = cached.encode(TEXTS)
    assert "e.sqlite: disk I/O error (" in caplog.text and "B free there" in caplog.text
    assert np.allclose(vecs, raw.encode(TEXTS), atol=1e-5) and cached.writes_stopped
