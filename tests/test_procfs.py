"""A process's tree from /proc, on real child processes."""

from __future__ import annotations

import os
import subprocess
import sys

from memrl.procfs import descendants, stat_fields


def test_descendants_finds_a_child_and_its_child_and_stat_fields_reads_their_parents():
    grandchild = "import sys; sys.stdout.write('up'); sys.stdout.flush(); sys.stdin.read()"
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {grandchild!r}])",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout.read(2) == b"up"
        tree = descendants()
        assert child.pid in tree
        below = descendants(child.pid)
        assert len(below) == 1 and below[0] in tree
        assert int(stat_fields(below[0])[1]) == child.pid
        assert int(stat_fields(child.pid)[1]) == os.getpid()
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert child.pid not in descendants()  # reaped: gone from the tree
