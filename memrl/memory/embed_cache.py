"""A persistent embedding cache: each text is encoded once per (embedder, dtype), across episodes, runs and configs.

LongMemEval's haystacks share sessions (one session sits in many questions' haystacks), reruns and baselines
encode the same turns again, and a second config over the same data would too. :class:`CachedEmbedder` wraps any
:class:`~memrl.memory.embedder.Embedder`: ``encode`` looks every text up by its SHA-256 in a SQLite file under
``$MEMRL_CACHE_DIR/embeddings/``, encodes only the misses (in slices of :data:`COMMIT_EVERY` texts) and commits each slice as it is done, so a
killed ingest, even inside one long encode call (a whole ``_s`` haystack is one), resumes without re-encoding
what it had finished. The file is named by the embedder's identity (model, dtype,
dimension): another model or precision never reads these vectors. SQLite in WAL mode serialises writers, so Ray
actors and parallel runs can share one file.

A cache never kills a run: when the disk fills (SQLite's "database or disk is full", or "disk I/O error" when
not even its WAL index fits), one warning names the file, writes stop for the rest of the run
(:class:`memrl.blob_cache.BlobCache`), vectors are still encoded and returned (results equal an uncached run's),
and ``memory/embed_cache_writes_stopped`` reports 1.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from memrl.blob_cache import BlobCache

COMMIT_EVERY = 256  # texts encoded per slice: larger slices batch no better on a CPU and lose more to a kill


def cache_file(root: Path, name: str, dtype: str, dim: int) -> Path:
    """``<root>/embeddings/<model>-<dtype>-d<dim>.sqlite`` with the model name made file-safe (a path's tail
    plus a hash of the whole name, so two checkpoints called ``model`` never share a file)."""
    tail = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(str(name).rstrip("/")).name)[-48:] or "embedder"
    digest = hashlib.sha256(str(name).encode("utf-8")).hexdigest()[:10]
    return root / "embeddings" / f"{tail}-{digest}-{dtype}-d{dim}.sqlite"


class CachedEmbedder:
    """``inner`` with a persistent text → vector cache; ``hits`` / ``misses`` count texts since creation."""

    def __init__(self, inner, path: Path) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.dtype = getattr(inner, "dtype", "float32")
        self.name = getattr(inner, "name", type(inner).__name__)
        self.path = Path(path)
        self.hits = 0
        self.misses = 0
        # The table's name predates the shared BlobCache: files written before stay readable.
        self._blobs = BlobCache(self.path, "embedding cache", table="vectors", value="vec")

    def __getattr__(self, name: str):
        # Everything else (the model, its tokenizer, batch size) is the wrapped embedder's.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def writes_stopped(self) -> bool:
        return self._blobs.writes_stopped

    @staticmethod
    def key(text: str) -> bytes:
        return hashlib.sha256(text.encode("utf-8")).digest()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        keys = [self.key(t) for t in texts]
        found = self._lookup(keys)
        missing = list(dict.fromkeys(k for k in keys if k not in found))  # each distinct text encoded once
        first = {k: t for k, t in zip(keys, texts, strict=True)}
        for i in range(0, len(missing), COMMIT_EVERY):
            part = missing[i : i + COMMIT_EVERY]
            vecs = self.inner.encode([first[k] for k in part])
            fresh = {k: np.ascontiguousarray(v, dtype=np.float32) for k, v in zip(part, vecs, strict=True)}
            self._blobs.put_many({k: v.tobytes() for k, v in fresh.items()})
            found.update(fresh)
        self.misses += len(missing)  # texts encoded; every other text of the call came from the cache
        self.hits += len(keys) - len(missing)
        return np.stack([found[k] for k in keys]).astype(np.float32, copy=False)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def stats(self) -> dict[str, float]:
        total = self.hits + self.misses
        return {
            "memory/embed_cache_hits": float(self.hits),
            "memory/embed_cache_misses": float(self.misses),
            "memory/embed_cache_hit_rate": self.hits / total if total else 0.0,
            "memory/embed_cache_writes_stopped": float(self.writes_stopped),
        }

    def _lookup(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        out: dict[bytes, np.ndarray] = {}
        for key, blob in self._blobs.get_many(keys).items():
            vec = np.frombuffer(blob, dtype=np.float32)
            if vec.shape == (self.dim,):  # a torn or foreign row is simply encoded again
                out[key] = vec
        return out

    def close(self) -> None:
        self._blobs.close()
