"""Full-disk detection across the shapes writers report it in, and the error users read."""

from __future__ import annotations

import errno
import sqlite3

from memrl import disk
from memrl.disk import DiskFullError, disk_full_error, human_bytes, is_disk_full


def test_each_writer_s_full_disk_is_recognised():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    assert is_disk_full(RuntimeError("I/O error: No space left on device (os error 28)"))
    wrapped = RuntimeError("saving failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "full")
    assert is_disk_full(wrapped)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(RuntimeError("unexpected pos 64 vs 0"))


def test_torch_s_silent_error_counts_as_full_only_where_space_is_gone(tmp_path, monkeypatch):
    """torch's zip writer says only 'unexpected pos': the space left where it wrote decides."""
    torch_error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1088 vs 1034")
    monkeypatch.setattr(disk, "free_bytes", lambda path: 4096)
    assert is_disk_full(torch_error, tmp_path)
    monkeypatch.setattr(disk, "free_bytes", lambda path: 10**9)
    assert not is_disk_full(torch_error, tmp_path)


def test_the_error_names_path_space_and_fix(tmp_path):
    err = disk_full_error(
        "the model", tmp_path / "models", 538_000_000, "Set MEMRL_CACHE_DIR.", free=12_000_000
    )
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert str(err) == (
        f"no space left on the disk to write the model into {tmp_path / 'models'}: needs ~538 MB, 12 MB free "
        "there. Set MEMRL_CACHE_DIR."
    )
    not_yet_made = tmp_path / "a" / "b"  # the space is read at the nearest existing parent
    assert isinstance(disk_full_error("x", not_yet_made, None, "").free, int)
    assert [human_bytes(n) for n in (0, 999, 1500, 2_500_000_000)] == ["0 B", "999 B", "1.5 kB", "2.5 GB"]
    assert isinstance(err, DiskFullError) and err.needed == 538_000_000
