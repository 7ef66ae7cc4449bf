"""Per-call memory cgroup (``memory_total_mb``): one limit for every process of a call."""

from __future__ import annotations

import ast

import pytest

from memrl.tools import Sandbox, ToolInfraError
from memrl.tools import cgroup as cgroup_mod
from tests.tools.support import needs_bwrap, small_config


def _cgroups_available() -> bool:
    try:
        cgroup_mod.CgroupFactory(64, None)
    except ToolInfraError:
        return False
    return True


needs_cgroups = pytest.mark.skipif(not _cgroups_available(), reason="no writable memory cgroup here")

FORK_AND_ALLOCATE = """
import os, time
pids = []
for i in range(6):
    pid = os.fork()
    if pid == 0:
        b = bytearray(64 * 2**20)
        for j in range(0, len(b), 4096):
            b[j] = 1
        time.sleep(1)
        os._exit(0)
    pids.append(pid)
print([os.waitpid(p, 0)[1] for p in pids])
"""


@needs_bwrap
@needs_cgroups
@pytest.mark.parametrize("mode", ["bwrap", "rlimit"])
def test_total_memory_of_all_processes_is_capped(mode):
    """6 children x 64 MB each fit the per-process rlimit (128 MB) but not the 160 MB the call may use."""
    with Sandbox(small_config(mode=mode, memory_total_mb=160, timeout_s=5)) as sb:
        r = sb.run(FORK_AND_ALLOCATE)
        parent = sb.launcher.cgroups.parent
        single = sb.run(
            "b = bytearray(80 * 2**20)\nfor j in range(0, len(b), 4096):\n    b[j] = 1\nprint('x')"
        )
    statuses = ast.literal_eval(r.stdout)  # the parent survives and reports how its children ended
    assert r.extra["oom_kills"] >= 1 and statuses.count(9) == r.extra["oom_kills"]
    assert single.stdout == "x\n" and "oom_kills" not in single.extra
    assert not [p for p in parent.iterdir() if p.name.startswith("memrl-")]  # per-call cgroups removed


@needs_bwrap
@needs_cgroups
def test_oom_of_the_main_process_is_reported_as_memory_kill():
    with Sandbox(small_config(memory_total_mb=80, memory_mb=256, timeout_s=5)) as sb:
        r = sb.run("b = bytearray(200 * 2**20)\nfor j in range(0, len(b), 4096):\n    b[j] = 1")
    assert r.killed_reason == "memory" and r.exit_code != 0


def test_missing_cgroup_support_is_refused_with_fix_it(monkeypatch, tmp_path):
    monkeypatch.setattr(cgroup_mod, "_V1_ROOT", tmp_path / "nothing")
    with pytest.raises(ToolInfraError, match="memory_total_mb=0"):
        Sandbox(small_config(mode="rlimit", memory_total_mb=100))


def test_negative_total_is_rejected():
    with pytest.raises(ValueError, match="memory_total_mb must be >= 0"):
        small_config(memory_total_mb=-1)
