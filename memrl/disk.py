"""Writes that run out of disk space: one error naming the path, the space needed and free, and the fix.

A full disk reaches memrl in several shapes: ``OSError(ENOSPC)`` from Python, safetensors' ``SafetensorError``
("... No space left on device (os error 28)"), ``sqlite3.OperationalError("database or disk is full")`` and
torch's ``RuntimeError("[enforce fail at inline_container.cc] . unexpected pos ...")`` from its zip writer, which
says nothing of space at all. :func:`is_disk_full` recognises the first three by errno or message and the last by
the space left where the write went; callers then raise :class:`DiskFullError`, which the command line prints as
one line.
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from pathlib import Path

# Below this much free space a write that failed for no stated reason is taken as a full disk (torch's zip
# writer reports ENOSPC only as a position mismatch).
NEARLY_FULL_BYTES = 1 << 20

_FULL_MESSAGES = ("no space left on device", "os error 28", "database or disk is full", "disk quota exceeded")


class DiskFullError(OSError):
    """A write ran out of space. ``path`` is where it wrote; ``needed`` / ``free`` are bytes (None if unknown)."""

    def __init__(
        self, message: str, *, path: Path, needed: int | None = None, free: int | None = None
    ) -> None:
        super().__init__(errno.ENOSPC, message, str(path))
        self.message = message
        self.path = Path(path)
        self.needed = needed
        self.free = free

    def __str__(self) -> str:
        return self.message


def free_bytes(path: str | Path) -> int | None:
    """Free bytes on the filesystem holding ``path`` (its nearest existing ancestor); None if unknown."""
    here = Path(path).absolute()
    for candidate in (here, *here.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def human_bytes(n: int | None) -> str:
    """``538_000_000`` → ``'538 MB'`` (decimal units, as ``df -H`` prints them)."""
    if n is None:
        return "an unknown amount"
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


def _says_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(exc, sqlite3.Error) and getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL:
        return True
    return any(m in str(exc).lower() for m in _FULL_MESSAGES)


def is_disk_full(exc: BaseException, path: str | Path | None = None) -> bool:
    """Whether ``exc`` (or an exception it was raised from) means a full disk: by errno or message, else, when
    ``path`` is given, by less than :data:`NEARLY_FULL_BYTES` left there. Call it before removing what the
    failed write left, or the space it held counts as free."""
    seen: BaseException | None = exc
    while seen is not None:
        if _says_full(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    if path is None:
        return False
    free = free_bytes(path)
    return free is not None and free < NEARLY_FULL_BYTES


def disk_full_error(
    what: str, path: str | Path, needed: int | None, fix: str, free: int | None = None
) -> DiskFullError:
    """The error for a write of ``what`` into ``path`` that ran out of space; ``free`` defaults to the free
    space there now."""
    free = free_bytes(path) if free is None else free
    need = f"needs ~{human_bytes(needed)}, " if needed else ""
    message = (
        f"no space left on the disk to write {what} into {path}: {need}{human_bytes(free)} free there. {fix}"
    )
    return DiskFullError(message, path=Path(path), needed=needed, free=free)
