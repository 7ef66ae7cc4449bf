"""Atomic, checksummed on-disk format of a :class:`FaissFactStore`.

Layout (little-endian)::

    b"MEMRLFS1" | u64 header_len | header (UTF-8 JSON) | vectors (float32, [n_vectors, dim]) | sha256(header+vectors)

The header lists every namespace's records in ingest order; vectors follow in the same order, ``chunks`` rows
per record (the field is written only for chunked facts; absent = 1). FAISS indices
are rebuilt on load rather than serialised, so a file is independent of the index kind and of GPU/CPU.

Saving writes ``<path>.tmp-<pid>``, fsyncs it, ``os.replace``s it over ``path`` and fsyncs the directory: a
crash at any point leaves either the old file or the new one, never a mix.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from memrl.memory.config import MemoryConfig
from memrl.memory.store import FactRecord, FactStoreError

if TYPE_CHECKING:
    from memrl.memory.store import FaissFactStore

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


def write_store(path: str | os.PathLike, store: FaissFactStore) -> None:
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


def read_store(path: str | os.PathLike, cfg: MemoryConfig, cls: type[FaissFactStore]) -> FaissFactStore:
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
