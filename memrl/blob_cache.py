"""A persistent key → bytes table in one SQLite file (WAL) that never kills a run.

Shared by the caches memrl keeps under ``$MEMRL_CACHE_DIR`` (embeddings, greedy memory writes). SQLite in WAL
mode serialises writers, so Ray actors and parallel runs can share one file. When the disk fills (SQLite's
"database or disk is full", or "disk I/O error" when not even its WAL index fits), one warning names the file,
the error and the space free, writes stop for the rest of the run and reads go on: a cache only saves work.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path

from memrl.disk import free_bytes, human_bytes, is_disk_full

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z_]+$")
_CHUNK = 500  # keys per SELECT: SQLite bounds the number of bound parameters


class BlobCache:
    """``table`` (key BLOB → ``value`` BLOB) in ``path``; ``what`` names the cache in its one warning."""

    def __init__(self, path: Path, what: str, table: str = "blobs", value: str = "value") -> None:
        if not (_NAME.match(table) and _NAME.match(value)):
            raise ValueError(
                f"BlobCache: table/column names must be lower-case words, got {table!r}, {value!r}"
            )
        self.path = Path(path)
        self.what = what
        self.table, self.value = table, value
        self.writes_stopped = False
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=60.0, check_same_thread=False)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (key BLOB PRIMARY KEY, {value} BLOB NOT NULL)"
            )
            self._db.commit()
        except (OSError, sqlite3.Error) as exc:
            if not is_disk_full(exc, self.path):
                raise
            self._stop_writes(exc)
            if self._db is not None:
                self._db.close()
            self._db = None  # not even the table could be made: nothing to read either

    def get_many(self, keys: Iterable[bytes]) -> dict[bytes, bytes]:
        """The stored value of each of ``keys`` that has one."""
        out: dict[bytes, bytes] = {}
        ordered = list(dict.fromkeys(keys))
        if self._db is None:
            return out
        with self._lock:
            for i in range(0, len(ordered), _CHUNK):
                chunk = ordered[i : i + _CHUNK]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(
                    f"SELECT key, {self.value} FROM {self.table} WHERE key IN ({marks})", chunk
                ).fetchall()
                out.update((bytes(k), bytes(v)) for k, v in rows)
        return out

    def put_many(self, items: Mapping[bytes, bytes]) -> None:
        """Store ``items`` in one transaction (nothing once writes stopped)."""
        if self.writes_stopped or self._db is None or not items:
            return
        with self._lock:
            try:
                self._db.executemany(
                    f"INSERT OR REPLACE INTO {self.table} (key, {self.value}) VALUES (?, ?)",
                    list(items.items()),
                )
                self._db.commit()
            except sqlite3.Error as exc:
                if not is_disk_full(exc, self.path):
                    raise
                self._db.rollback()
                self._stop_writes(exc)

    def _stop_writes(self, exc: BaseException) -> None:
        self.writes_stopped = True
        logger.warning(
            "%s %s: %s (%s free there); the run goes on without writing to the cache (free space, or move the "
            "cache with MEMRL_CACHE_DIR)",
            self.what,
            self.path,
            exc,
            human_bytes(free_bytes(self.path)),
        )

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
