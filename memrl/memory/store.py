"""Long-term fact stores.

Contract (every implementation is tested against it, ``tests/memory/test_store.py``):

* ``search`` returns **similarities, higher = closer**, sorted descending (for the normalised vectors memrl
  stores, the score is the cosine similarity). mem0's FAISS store returned distances under the same
  docstring; we test the contract instead of trusting it.
* Fact ids are stable int64s, unique across the whole store and never reused after a delete.
* Namespaces (one per episode) are isolated: a search in one never returns another's facts.
  ``copy_namespace`` gives a new namespace the same facts (texts, vectors, sources, order) under new ids.
* ``update`` keeps the id; ``delete`` removes the fact from search and from ``records``.
* A fact may hold several vectors (the chunks of a text longer than the embedder's window, see
  :func:`memrl.memory.embedder.window_chunks`): ``search`` scores it by its **best** vector (max over chunks) and
  returns it once.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import os
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import faiss
import numpy as np

from memrl.memory.config import MemoryConfig
from memrl.registry import Registry

logger = logging.getLogger(__name__)


class FactStoreError(RuntimeError):
    """The store was used wrongly (unknown fact id, vector shape) or its file is unreadable/corrupt."""


@dataclass(frozen=True)
class FactRecord:
    """One long-term fact. ``source_ids`` are the dialog/turn ids it was extracted from (gold-evidence
    traceable); ``order`` is the store-wide ingest sequence number (recency, neighbour expansion)."""

    fact_id: int
    namespace: str
    text: str
    speaker: str = ""
    timestamp: str | None = None
    source_ids: tuple[str, ...] = ()
    created_turn: str = ""
    updated_turn: str = ""
    order: int = 0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def superseded(self) -> bool:
        """An UPDATE replaced it; it stays as history (``extra``: ``superseded_by``, ``valid_until``)."""
        return self.extra.get("superseded_by") is not None


@dataclass(frozen=True)
class NewFact:
    """A fact to add; the store assigns ``fact_id`` and ``order``."""

    text: str
    speaker: str = ""
    timestamp: str | None = None
    source_ids: tuple[str, ...] = ()
    turn_id: str = ""
    extra: dict = field(default_factory=dict, compare=False)


Ranked = list[tuple[int, float]]
"""``(fact_id, score)`` pairs, higher = better, best first: what a search or a retriever returns."""

# Candidates a retriever ranks before fusion and rescoring (and HNSW's search depth): rescoring can lift a fact
# from well below top_k, so it needs more than top_k to choose from.
CANDIDATE_POOL = 100

FactVectors = np.ndarray | Sequence[np.ndarray]
"""``[n_facts, dim]`` (one vector per fact), or one ``[n_chunks_i, dim]`` array per fact (chunked facts)."""


class FactStore(abc.ABC):
    """Namespaced vector store of :class:`FactRecord`. See the module docstring for the contract."""

    dim: int

    @abc.abstractmethod
    def add(self, namespace: str, facts: Sequence[NewFact], vectors: FactVectors) -> list[int]:
        """Add ``facts`` with their vectors (:data:`FactVectors`); returns the new fact ids in order."""

    @abc.abstractmethod
    def update(
        self, namespace: str, fact_id: int, text: str, vector: np.ndarray, turn_id: str, **changes
    ) -> FactRecord:
        """Replace a fact's text/vector (``[dim]``, or ``[n_chunks, dim]``) keeping its id; ``changes`` may set
        speaker/timestamp/source_ids."""

    @abc.abstractmethod
    def delete(self, namespace: str, fact_ids: Sequence[int]) -> None:
        """Remove facts; unknown ids raise :class:`FactStoreError`."""

    @abc.abstractmethod
    def search(self, namespace: str, queries: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        """Per query row of ``[q, dim]``: up to ``k`` ``(fact_id, similarity)``, highest similarity first."""

    @abc.abstractmethod
    def get(self, namespace: str, fact_id: int) -> FactRecord: ...

    @abc.abstractmethod
    def records(self, namespace: str) -> list[FactRecord]:
        """All live facts of a namespace in ingest order (oldest first)."""

    @abc.abstractmethod
    def vectors(self, namespace: str, fact_ids: Sequence[int]) -> np.ndarray:
        """Each fact's leading vector ``[len(fact_ids), dim]`` (a chunked fact's first chunk)."""

    def chunk_vectors(self, namespace: str, fact_id: int) -> np.ndarray:
        """All vectors of one fact ``[n_chunks, dim]`` (saving without re-encoding)."""
        return self.vectors(namespace, [fact_id])

    @abc.abstractmethod
    def namespaces(self) -> list[str]: ...

    @abc.abstractmethod
    def revision(self, namespace: str) -> int:
        """A counter that changes whenever the namespace changes (cache key for lexical indices)."""

    @abc.abstractmethod
    def drop_namespace(self, namespace: str) -> None: ...

    @abc.abstractmethod
    def copy_namespace(self, source: str, target: str) -> dict[int, int]:
        """Copy every live fact of ``source`` into the new namespace ``target`` (which must not exist), keeping
        their ingest order; returns ``{source fact id: target fact id}``. A missing ``source`` copies nothing."""

    @abc.abstractmethod
    def save(self, path: str) -> None:
        """Atomically persist the store (a crash mid-save leaves the previous file intact)."""

    @classmethod
    @abc.abstractmethod
    def load(cls, path: str, cfg: MemoryConfig) -> FactStore:
        """Read a store written by ``save``; a corrupt file raises :class:`FactStoreError` naming it."""


FactStoreFactory = Callable[[MemoryConfig, int], FactStore]
FACT_STORES: Registry[FactStoreFactory] = Registry("fact store")

# ---------------------------------------------------------------------------------------------------------
# FAISS index kinds. Each builds an *empty* inner-product index for ``n`` expected vectors; IVF needs
# training, so it is (re)built from the namespace's vectors when first searched.

IndexBuilder = Callable[[int, MemoryConfig, np.ndarray], faiss.Index]


def _flat(dim: int, cfg: MemoryConfig, train: np.ndarray) -> faiss.Index:
    return faiss.IndexFlatIP(dim)


def _hnsw(dim: int, cfg: MemoryConfig, train: np.ndarray) -> faiss.Index:
    index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efSearch = CANDIDATE_POOL
    return index


def _ivf(dim: int, cfg: MemoryConfig, train: np.ndarray) -> faiss.Index:
    # faiss wants ~39 points per centroid; small namespaces get fewer lists rather than a training warning.
    nlist = max(1, min(cfg.ivf_nlist, len(train) // 39))
    quantizer = faiss.IndexFlatIP(dim)
    index = faiss.IndexIVFFlat(quantizer, dim, nlist, faiss.METRIC_INNER_PRODUCT)
    if nlist == 1:
        # One list holds everything: its centroid is irrelevant, so skip k-means on a handful of points.
        quantizer.add(np.zeros((1, dim), dtype=np.float32))
        index.is_trained = True
    else:
        index.train(train)
    index.nprobe = min(nlist, 8)
    return index


INDEX_KINDS: dict[str, tuple[IndexBuilder, bool, bool]] = {
    # name: (builder, needs_training_data, removes_in_place)
    # IndexIDMap2.remove_ids is only correct when the wrapped index renumbers like a flat array; HNSW cannot
    # remove at all and IVF keeps stale internal ids, so both are rebuilt from the kept vectors instead.
    "flat": (_flat, False, True),
    "hnsw": (_hnsw, False, False),
    "ivf": (_ivf, True, False),
}


# A fact's chunk j has FAISS id ``fact_id * CHUNK_SLOTS + j``: search maps a hit back with one division.
CHUNK_SLOTS = 1 << 12  # a 200 k-character turn (the adapters' limit) is ~250 MiniLM windows


def _chunk_ids(fact_id: int, n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64) + fact_id * CHUNK_SLOTS


def _maybe_gpu(index: faiss.Index, cfg: MemoryConfig) -> faiss.Index:
    if not cfg.use_gpu or not hasattr(faiss, "get_num_gpus") or faiss.get_num_gpus() == 0:
        return index
    try:
        return faiss.index_cpu_to_all_gpus(index)
    except RuntimeError as exc:  # e.g. HNSW has no GPU implementation: stay on CPU, but say so
        logger.warning("faiss GPU transfer failed (%s); keeping the index on CPU", exc)
        return index


class _Namespace:
    """One episode's facts: records, their vectors ``[n_chunks, dim]`` each (kept for rebuilds and saving) and
    the FAISS index over every chunk vector."""

    def __init__(self, dim: int, cfg: MemoryConfig) -> None:
        self.dim = dim
        self.cfg = cfg
        self.records: dict[int, FactRecord] = {}
        self.vectors: dict[int, np.ndarray] = {}
        self.n_vectors = 0
        self.index: faiss.Index | None = None
        self.dirty = True  # index must be rebuilt from ``vectors`` before the next search
        self.revision = 0

    def rebuild(self) -> None:
        builder, needs_train, _ = INDEX_KINDS[self.cfg.index]
        fids = list(self.records)
        ids = np.concatenate([_chunk_ids(f, len(self.vectors[f])) for f in fids] or [np.zeros(0, np.int64)])
        mat = np.concatenate([self.vectors[f] for f in fids]) if fids else np.zeros((0, self.dim), np.float32)
        base = builder(self.dim, self.cfg, mat if needs_train else mat[:0])
        index = faiss.IndexIDMap2(base)
        if len(ids):
            index.add_with_ids(mat, ids)
        self.index = _maybe_gpu(index, self.cfg)
        self.dirty = False

    def put(self, fact_id: int, mat: np.ndarray) -> None:
        self.vectors[fact_id] = mat.copy()
        self.n_vectors += len(mat)
        if self.dirty or self.index is None:
            return  # rebuilt lazily from self.vectors
        self.index.add_with_ids(mat, _chunk_ids(fact_id, len(mat)))

    def remove(self, fact_ids: Sequence[int]) -> None:
        chunks = [_chunk_ids(f, len(self.vectors[f])) for f in fact_ids]
        for f in fact_ids:
            self.n_vectors -= len(self.vectors.pop(f))
        if self.dirty or self.index is None or not chunks:
            return
        if INDEX_KINDS[self.cfg.index][2]:
            self.index.remove_ids(np.concatenate(chunks))
        else:
            self.dirty = True  # rebuilt from self.vectors on the next search


class FaissFactStore(FactStore):
    """FAISS store with one ``IndexIDMap2`` per namespace (flat / HNSW / IVF by ``cfg.index``)."""

    def __init__(self, cfg: MemoryConfig, dim: int) -> None:
        if dim < 1:
            raise FactStoreError(f"embedding dim must be >= 1, got {dim}")
        self.cfg = cfg
        self.dim = dim
        self._spaces: dict[str, _Namespace] = {}
        self._next_id = 1
        self._next_order = 0
        self._revisions = 0  # store-wide, so a dropped and re-created namespace never repeats a revision

    def _tick(self) -> int:
        self._revisions += 1
        return self._revisions

    # -- helpers ---------------------------------------------------------------------------------------
    def _space(self, namespace: str, create: bool = False) -> _Namespace:
        space = self._spaces.get(namespace)
        if space is None:
            if not create:
                raise FactStoreError(f"unknown namespace {namespace!r}; known: {sorted(self._spaces)[:10]}")
            space = self._spaces[namespace] = _Namespace(self.dim, self.cfg)
        return space

    def _check_vectors(self, vectors: np.ndarray, n: int | None, what: str) -> np.ndarray:
        """``vectors`` as float32 ``[n, dim]`` (``n=None``: any number of rows from 1 to CHUNK_SLOTS)."""
        mat = np.ascontiguousarray(vectors, dtype=np.float32)
        rows_ok = mat.ndim == 2 and (len(mat) == n if n is not None else 1 <= len(mat) <= CHUNK_SLOTS)
        if not rows_ok or mat.shape[1] != self.dim:
            want = (n if n is not None else "n_chunks", self.dim)
            raise FactStoreError(f"{what}: expected vectors of shape {want}, got {mat.shape}")
        if not np.isfinite(mat).all():
            raise FactStoreError(f"{what}: vectors contain NaN/inf")
        return mat

    def _per_fact(self, vectors: FactVectors, n: int, what: str) -> list[np.ndarray]:
        if isinstance(vectors, np.ndarray):
            return list(self._check_vectors(vectors, n, what)[:, None, :])
        if len(vectors) != n:
            raise FactStoreError(f"{what}: {len(vectors)} vector arrays for {n} facts")
        return [self._check_vectors(v, None, f"{what}, fact {i}") for i, v in enumerate(vectors)]

    def _record(self, namespace: str, fact_id: int) -> FactRecord:
        space = self._space(namespace)
        if fact_id not in space.records:
            raise FactStoreError(f"namespace {namespace!r} has no fact id {fact_id}")
        return space.records[fact_id]

    # -- contract --------------------------------------------------------------------------------------
    def add(self, namespace: str, facts: Sequence[NewFact], vectors: FactVectors) -> list[int]:
        mats = self._per_fact(vectors, len(facts), f"add to {namespace!r}")
        space = self._space(namespace, create=True)
        ids = np.arange(self._next_id, self._next_id + len(facts), dtype=np.int64)
        self._next_id += len(facts)
        for fid, fact, mat in zip(ids.tolist(), facts, mats, strict=True):
            space.records[fid] = FactRecord(
                fact_id=fid,
                namespace=namespace,
                text=fact.text,
                speaker=fact.speaker,
                timestamp=fact.timestamp,
                source_ids=tuple(fact.source_ids),
                created_turn=fact.turn_id,
                updated_turn=fact.turn_id,
                order=self._next_order,
                extra=dict(fact.extra),
            )
            self._next_order += 1
            space.put(fid, mat)
        space.revision = self._tick()
        return ids.tolist()

    def update(
        self, namespace: str, fact_id: int, text: str, vector: np.ndarray, turn_id: str, **changes
    ) -> FactRecord:
        old = self._record(namespace, fact_id)
        vec = np.asarray(vector)
        vec = self._check_vectors(
            vec.reshape(1, -1) if vec.ndim == 1 else vec, None, f"update fact {fact_id}"
        )
        allowed = {"speaker", "timestamp", "source_ids", "extra"}
        if set(changes) - allowed:
            raise FactStoreError(f"update: unknown fields {sorted(set(changes) - allowed)}; valid {allowed}")
        if "source_ids" in changes:
            changes["source_ids"] = tuple(changes["source_ids"])
        new = replace(old, text=text, updated_turn=turn_id, **changes)
        space = self._space(namespace)
        space.records[fact_id] = new
        space.remove([fact_id])
        space.put(fact_id, vec)
        space.revision = self._tick()
        return new

    def delete(self, namespace: str, fact_ids: Sequence[int]) -> None:
        for fid in fact_ids:
            self._record(namespace, fid)  # validate all before mutating anything
        space = self._space(namespace)
        for fid in fact_ids:
            del space.records[fid]
        space.remove(list(fact_ids))
        space.revision = self._tick()

    def search(self, namespace: str, queries: np.ndarray, k: int) -> list[list[tuple[int, float]]]:
        q = np.ascontiguousarray(queries, dtype=np.float32)
        if q.ndim != 2 or q.shape[1] != self.dim:
            raise FactStoreError(f"search in {namespace!r}: expected queries [n, {self.dim}], got {q.shape}")
        space = self._spaces.get(namespace)
        if space is None or not space.records or k < 1:
            return [[] for _ in range(len(q))]
        if space.dirty or space.index is None:
            space.rebuild()
        # Enough chunk hits that k distinct facts are among them even if other facts' extra chunks come first.
        n_hits = min(space.n_vectors, k + space.n_vectors - len(space.records))
        sims, ids = space.index.search(q, n_hits)
        return [_best_per_fact(row_ids, row_sims, k) for row_ids, row_sims in zip(ids, sims, strict=True)]

    def get(self, namespace: str, fact_id: int) -> FactRecord:
        return self._record(namespace, fact_id)

    def records(self, namespace: str) -> list[FactRecord]:
        space = self._spaces.get(namespace)
        return sorted(space.records.values(), key=lambda r: r.order) if space else []

    def vectors(self, namespace: str, fact_ids: Sequence[int]) -> np.ndarray:
        space = self._space(namespace)
        if not fact_ids:
            return np.zeros((0, self.dim), np.float32)
        return np.stack([space.vectors[int(i)][0] for i in fact_ids])

    def chunk_vectors(self, namespace: str, fact_id: int) -> np.ndarray:
        self._record(namespace, fact_id)
        return self._space(namespace).vectors[int(fact_id)].copy()

    def namespaces(self) -> list[str]:
        return sorted(self._spaces)

    def revision(self, namespace: str) -> int:
        space = self._spaces.get(namespace)
        return space.revision if space else 0

    def drop_namespace(self, namespace: str) -> None:
        self._spaces.pop(namespace, None)

    def copy_namespace(self, source: str, target: str) -> dict[int, int]:
        if target in self._spaces:
            raise FactStoreError(f"copy_namespace: target namespace {target!r} already exists")
        src = self._spaces.get(source)
        if src is None:
            return {}
        dst = self._space(target, create=True)
        ids: dict[int, int] = {}
        for rec in sorted(src.records.values(), key=lambda r: r.order):
            ids[rec.fact_id] = fid = self._next_id
            self._next_id += 1
            dst.records[fid] = replace(
                rec, fact_id=fid, namespace=target, order=self._next_order, extra=dict(rec.extra)
            )
            self._next_order += 1
            dst.put(fid, src.vectors[rec.fact_id])  # the index is built from these on the first search
        for rec in dst.records.values():
            # A superseded fact names its successor by id: the copy's, or the chain breaks and the stale value
            # reads as current history in every copied namespace (each question of a shared history).
            if rec.extra.get("superseded_by") in ids:
                rec.extra["superseded_by"] = ids[rec.extra["superseded_by"]]
        dst.revision = self._tick()
        return ids

    # -- persistence (the file format is at the end of this module) -----------------------------------
    def save(self, path: str) -> None:
        _write_store(path, self)

    @classmethod
    def load(cls, path: str, cfg: MemoryConfig) -> FaissFactStore:
        return _read_store(path, cfg, cls)


def _best_per_fact(chunk_ids: np.ndarray, sims: np.ndarray, k: int) -> list[tuple[int, float]]:
    """Chunk hits (best first) → the first k distinct facts, each scored by its best chunk."""
    out: dict[int, float] = {}
    for cid, sim in zip(chunk_ids.tolist(), sims.tolist(), strict=True):
        if cid < 0:
            continue
        out.setdefault(cid // CHUNK_SLOTS, sim)
        if len(out) == k:
            break
    return list(out.items())


# -- on-disk format of a FaissFactStore: atomic and checksummed -----------------------------------------
# Layout (little-endian)::
#
#     b"MEMRLFS1" | u64 header_len | header (UTF-8 JSON) | vectors (float32, [n_vectors, dim]) | sha256(header+vectors)
#
# The header lists every namespace's records in ingest order; vectors follow in the same order, ``chunks`` rows
# per record (the field is written only for chunked facts; absent = 1). FAISS indices are rebuilt on load rather
# than serialised, so a file is independent of the index kind and of GPU/CPU.
#
# Saving writes ``<path>.tmp-<pid>``, fsyncs it, ``os.replace``s it over ``path`` and fsyncs the directory: a
# crash at any point leaves either the old file or the new one, never a mix.

MAGIC = b"MEMRLFS1"
VERSION = 1
_DIGEST = 32


def _encode(store: FaissFactStore) -> bytes:
    spaces = {}
    chunks = []
    for ns in store.namespaces():
        recs = store.records(ns)
        spaces[ns] = [
            {
                "fact_id": r.fact_id,
                "text": r.text,
                "speaker": r.speaker,
                "timestamp": r.timestamp,
                "source_ids": list(r.source_ids),
                "created_turn": r.created_turn,
                "updated_turn": r.updated_turn,
                "order": r.order,
                "extra": r.extra,
            }
            for r in recs
        ]
        for rec, r in zip(spaces[ns], recs, strict=True):
            mat = store.chunk_vectors(ns, r.fact_id)
            if len(mat) > 1:
                rec["chunks"] = len(mat)
            chunks.append(mat.astype("<f4"))
    header = json.dumps(
        {
            "version": VERSION,
            "dim": store.dim,
            "next_id": store._next_id,
            "next_order": store._next_order,
            "namespaces": spaces,
        }
    ).encode("utf-8")
    payload = np.concatenate(chunks).tobytes() if chunks else b""
    body = header + payload
    return MAGIC + struct.pack("<Q", len(header)) + body + hashlib.sha256(body).digest()


def _write_store(path: str | os.PathLike, store: FaissFactStore) -> None:
    """Atomically replace ``path`` with the serialised store."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    data = _encode(store)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():  # the replace did not happen: do not leave the partial file behind
            tmp.unlink()
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)


def _corrupt(path: Path, why: str) -> FactStoreError:
    return FactStoreError(f"fact store file {str(path)!r} is corrupt or not a memrl store: {why}")


def _decode_header(path: Path, data: bytes) -> tuple[dict, bytes]:
    if len(data) < len(MAGIC) + 8 + _DIGEST or not data.startswith(MAGIC):
        raise _corrupt(path, f"missing the {MAGIC!r} header (size {len(data)} bytes)")
    (hlen,) = struct.unpack("<Q", data[len(MAGIC) : len(MAGIC) + 8])
    body = data[len(MAGIC) + 8 : -_DIGEST]
    if hashlib.sha256(body).digest() != data[-_DIGEST:]:
        raise _corrupt(path, "sha256 checksum mismatch (truncated or modified)")
    if hlen > len(body):
        raise _corrupt(path, f"header length {hlen} exceeds body size {len(body)}")
    try:
        header = json.loads(body[:hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _corrupt(path, f"header is not JSON: {exc}") from exc
    if header.get("version") != VERSION:
        raise _corrupt(path, f"format version {header.get('version')!r}, this memrl reads {VERSION}")
    return header, body[hlen:]


def _read_store(path: str | os.PathLike, cfg: MemoryConfig, cls: type[FaissFactStore]) -> FaissFactStore:
    p = Path(path)
    if not p.is_file():
        raise FactStoreError(f"fact store file {str(p)!r} does not exist")
    header, payload = _decode_header(p, p.read_bytes())
    dim = int(header["dim"])
    n_rows = sum(int(r.get("chunks", 1)) for v in header["namespaces"].values() for r in v)
    if len(payload) != n_rows * dim * 4:
        raise _corrupt(p, f"expected {n_rows}x{dim} float32 vectors, found {len(payload)} bytes")
    mat = np.frombuffer(payload, dtype="<f4").reshape(n_rows, dim).astype(np.float32)
    store = cls(cfg, dim)
    row = 0
    for ns, recs in header["namespaces"].items():
        space = store._space(ns, create=True)
        for r in recs:
            n = int(r.pop("chunks", 1))
            rec = FactRecord(namespace=ns, **{**r, "source_ids": tuple(r["source_ids"])})
            space.records[rec.fact_id] = rec
            space.put(rec.fact_id, mat[row : row + n])
            row += n
        space.dirty = True
    store._next_id = int(header["next_id"])
    store._next_order = int(header["next_order"])
    return store


@FACT_STORES.register("faiss")
def _faiss_store(cfg: MemoryConfig, dim: int) -> FactStore:
    return FaissFactStore(cfg, dim)
