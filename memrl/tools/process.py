"""Supervising one sandboxed process tree: bounded output capture, wall-clock deadline, kill, reap.

Everything here holds whatever the child does: output is read as it comes and only a bounded head and tail are
kept (the rest is counted), the deadline is enforced by SIGKILL of the sandbox's pid-namespace init (which
takes every process inside with it) and of the whole process group, and the leader is always reaped.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass, field


class CappedBuffer:
    """Keeps the first ``keep // 2`` and the last ``keep // 2`` bytes of a stream; counts the rest."""

    def __init__(self, keep: int) -> None:
        self.half = max(keep // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > self.half:
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        omitted = self.total - len(self.head) - len(self.tail)
        middle = f"\n...[{omitted} bytes omitted]...\n".encode() if omitted > 0 else b""
        return bytes(self.head + middle + self.tail).decode("utf-8", errors="replace")


@dataclass
class Supervised:
    """What happened to one process tree (filled in by :func:`supervise`)."""

    returncode: int | None = None
    timed_out: bool = False
    killed_reason: str | None = None  # "timeout" | "output_limit"
    kill_latency_s: float | None = None  # deadline (or limit) → tree reaped
    status: dict = field(default_factory=dict)  # merged bwrap --json-status-fd documents
    status_complete: bool = False
    ready: bool = False  # the bootstrap reported the interpreter running under its limits


class _StatusReader:
    """Parses bwrap's ``--json-status-fd`` stream (one JSON object per line)."""

    def __init__(self) -> None:
        self.buf = b""
        self.doc: dict = {}

    def feed(self, data: bytes) -> None:
        self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if line.strip():
                self.doc.update(json.loads(line))


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (ProcessLookupError, OSError):
        return None


def kill_tree(proc: subprocess.Popen, pidfd: int | None) -> None:
    """SIGKILL the sandbox's pid-namespace init first (the kernel then kills everything in that namespace and
    bwrap reaps it, so nothing is reparented to the host's init as a zombie), then the whole process group."""
    if pidfd is not None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        give_up = time.monotonic() + 1.0
        while not _exited_unreaped(proc.pid) and time.monotonic() < give_up:
            time.sleep(0.001)
    # The leader is unreaped (a zombie at worst), so its pgid cannot have been reused yet.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def supervise(
    proc: subprocess.Popen,
    streams: dict[int, CappedBuffer],
    ready_fd: int,
    status_fd: int | None,
    deadline: float,
    max_stream_bytes: int,
) -> Supervised:
    """Read ``streams`` (fd → buffer), ``ready_fd`` and ``status_fd`` until EOF, the deadline or the output
    limit; then make sure the tree is dead and the leader reaped. Closes every fd it was given."""
    out = Supervised()
    status = _StatusReader()
    pidfd: int | None = None
    sel = selectors.DefaultSelector()
    fds = [*streams, ready_fd] + ([status_fd] if status_fd is not None else [])
    for fd in fds:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                out.timed_out, out.killed_reason = True, "timeout"
                break
            for key, _ in sel.select(remaining):
                fd = key.fd
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(fd)
                    continue
                if fd == ready_fd:
                    out.ready = True
                    continue
                if fd == status_fd:
                    status.feed(data)
                    if pidfd is None and "child-pid" in status.doc:
                        pidfd = _open_pidfd(int(status.doc["child-pid"]))
                    continue
                streams[fd].feed(data)
                if sum(b.total for b in streams.values()) > max_stream_bytes:
                    out.killed_reason = "output_limit"
            if out.killed_reason:
                break
        _finish(proc, out, pidfd, deadline)
        _await_ns_init(pidfd)
    finally:
        sel.close()
        for fd in fds:
            os.close(fd)
        if pidfd is not None:
            os.close(pidfd)
    out.status = status.doc
    out.status_complete = "exit-code" in status.doc
    return out


def _await_ns_init(pidfd: int | None) -> None:
    """bwrap's outer process exits as soon as its namespace init reports the exit code, so the init may still be
    tearing the namespace down (it is then reaped by the host's init, not by us). Wait until it has exited, so
    no process of the call is alive when we return; SIGKILL it if it lingers."""
    if pidfd is None:
        return
    if not select.select([pidfd], [], [], 0.5)[0]:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        select.select([pidfd], [], [], 1.0)


def _exited_unreaped(pid: int) -> bool:
    """True once ``pid`` has exited; it stays a zombie (WNOWAIT), so its pid and pgid cannot be reused."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None
    except ChildProcessError:
        return True


def _finish(proc: subprocess.Popen, out: Supervised, pidfd: int | None, deadline: float) -> None:
    """Streams are closed (or we gave up on them): wait for the leader within the deadline, kill if needed,
    sweep the process group while the leader is still a zombie, then reap it."""
    if out.killed_reason is None:
        delay = 0.0005
        while not _exited_unreaped(proc.pid):
            if time.monotonic() >= deadline:
                out.timed_out, out.killed_reason = True, "timeout"
                break
            time.sleep(delay)
            delay = min(delay * 2, 0.01)
    if out.killed_reason is not None:
        trigger = min(time.monotonic(), deadline) if out.timed_out else time.monotonic()
        kill_tree(proc, pidfd)
        proc.wait()
        out.kill_latency_s = time.monotonic() - trigger
    else:
        # rlimit mode has no pid namespace: children left in the group die with the call.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    out.returncode = proc.returncode
