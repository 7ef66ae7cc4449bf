"""A memory cgroup per sandbox call: one limit for ALL processes of the call (``tools.sandbox.memory_total_mb``).

rlimits bound each process (``memory_mb``) and their number (``max_processes``), so without a cgroup the worst
case of one call is their product. With ``memory_total_mb`` set, every call runs in its own cgroup whose memory
limit covers the whole tree; the kernel OOM-kills inside it and the call reports ``killed_reason="memory"``.

The launcher enters the cgroup *before* exec'ing bubblewrap (``sh -c 'echo $$ > cgroup.procs; exec bwrap …'``),
so there is no window in which a child runs outside it. cgroup v1 (memory controller) is found automatically
when memrl may write to it (root); cgroup v2 needs ``cgroup_parent``: a delegated directory with the memory
controller enabled in its ``cgroup.subtree_control``.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from pathlib import Path

from memrl.tools.base import ToolInfraError

_V1_ROOT = Path("/sys/fs/cgroup/memory")
_counter = itertools.count()


def _own_v1_path() -> Path:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _V1_ROOT / path.lstrip("/")
    raise ToolInfraError("cgroup v1 memory controller is mounted but this process is not in a memory cgroup")


class CgroupFactory:
    """Creates per-call cgroups under one parent; checks once that it can."""

    def __init__(self, total_mb: int, owner_uid: int | None, parent: str = "") -> None:
        self.limit = total_mb << 20
        self.owner_uid = owner_uid
        if parent:
            self.parent, self.v2 = Path(parent), True
        elif (_V1_ROOT / "memory.limit_in_bytes").exists():
            self.parent, self.v2 = _own_v1_path(), False
        else:
            raise ToolInfraError(
                "tools.sandbox.memory_total_mb needs a memory cgroup: cgroup v1 with a writable memory controller "
                "(run as root), or cgroup v2 with tools.sandbox.cgroup_parent set to a delegated directory whose "
                "cgroup.subtree_control enables +memory. Set memory_total_mb=0 to rely on rlimits only."
            )
        if not os.access(self.parent, os.W_OK):
            raise ToolInfraError(
                f"cannot create cgroups under {self.parent} (not writable by uid {os.geteuid()})"
            )

    def create(self) -> CallCgroup:
        return CallCgroup(self, self.parent / f"memrl-{os.getpid()}-{next(_counter)}")


class CallCgroup:
    def __init__(self, factory: CgroupFactory, path: Path) -> None:
        self.path, self.v2 = path, factory.v2
        try:
            path.mkdir()
            limit = str(factory.limit)
            if self.v2:
                (path / "memory.max").write_text(limit)
                with contextlib.suppress(OSError):
                    (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(limit)
                with contextlib.suppress(OSError):  # only with swap accounting
                    (path / "memory.memsw.limit_in_bytes").write_text(limit)
            if (
                factory.owner_uid is not None
            ):  # the launcher shell runs as the sandbox uid and moves itself in
                os.chown(path / "cgroup.procs", factory.owner_uid, -1)
        except OSError as exc:
            self.remove()
            raise ToolInfraError(f"cannot set up the call's memory cgroup {path}: {exc}") from exc

    @property
    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def oom_kills(self) -> int:
        name = "memory.events" if self.v2 else "memory.oom_control"
        with contextlib.suppress(OSError):
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self) -> None:
        """Kill anything still inside (nothing should be) and remove the directory."""
        for _ in range(50):
            try:
                pids = [int(p) for p in (self.path / "cgroup.procs").read_text().split()]
            except OSError:
                pids = []
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:  # EBUSY while the last processes finish exiting
                time.sleep(0.01)
        raise ToolInfraError(f"cannot remove the call's cgroup {self.path}")
