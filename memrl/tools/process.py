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
    except OSError:  # already gone
        return None


def _wait_fd(fd: int, timeout: float) -> bool:
    """Wait until ``fd`` is readable (a pidfd: the process exited) or ``timeout`` passes."""
    return bool(select.select([fd], [], [], max(timeout, 0.0))[0])


def kill_tree(leader_pidfd: int, leader_pid: int, ns_pidfd: int | None) -> None:
    """SIGKILL the sandbox's pid-namespace init first (the kernel then kills everything in that namespace and
    bwrap reaps it and exits), then the whole process group of the leader."""
    if ns_pidfd is not None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(ns_pidfd, signal.SIGKILL)
        _wait_fd(leader_pidfd, 1.0)
    # The leader is unreaped (a zombie at worst), so its pgid cannot have been reused yet.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader_pid, signal.SIGKILL)


class _Reader:
    """One supervised call's fds: output streams, the ready pipe, bwrap's status pipe, the leader's pidfd."""

    def __init__(self, streams: dict[int, CappedBuffer], ready_fd: int, status_fd: int | None, leader: int):
        self.streams, self.ready_fd, self.status_fd, self.leader = streams, ready_fd, status_fd, leader
        self.status = _StatusReader()
        self.ready = False
        self.ns_pidfd: int | None = None
        self.sel = selectors.DefaultSelector()
        self.pipes = [*streams, ready_fd] + ([status_fd] if status_fd is not None else [])
        for fd in self.pipes:
            os.set_blocking(fd, False)
            self.sel.register(fd, selectors.EVENT_READ)
        self.sel.register(leader, selectors.EVENT_READ)

    def output_bytes(self) -> int:
        return sum(b.total for b in self.streams.values())

    def read(self, fd: int) -> int:
        """One read from a pipe: bytes read, 0 if nothing was available, -1 at EOF (then unregistered)."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return 0
        if not data:
            self.sel.unregister(fd)
            return -1
        if fd == self.ready_fd:
            self.ready = True
        elif fd == self.status_fd:
            self.status.feed(data)
            if self.ns_pidfd is None and "child-pid" in self.status.doc:
                self.ns_pidfd = _open_pidfd(int(self.status.doc["child-pid"]))
        else:
            self.streams[fd].feed(data)
        return len(data)

    def drain(self, max_bytes: int) -> None:
        """After the leader exited: take what is already buffered in the pipes, bounded (a surviving writer in
        rlimit mode must not keep us here)."""
        for fd in self.pipes:
            while fd in self.sel.get_map() and self.output_bytes() <= max_bytes and self.read(fd) > 0:
                pass

    def close(self) -> None:
        self.sel.close()
        for fd in self.pipes:
            os.close(fd)
        if self.ns_pidfd is not None:
            os.close(self.ns_pidfd)


def supervise(
    proc: subprocess.Popen,
    streams: dict[int, CappedBuffer],
    ready_fd: int,
    status_fd: int | None,
    deadline: float,
    max_stream_bytes: int,
) -> Supervised:
    """Read ``streams`` (fd → buffer), ``ready_fd`` and ``status_fd`` until the leader exits, the deadline or
    the output limit; then make sure the tree is dead and the leader reaped. Closes every fd it was given."""
    out = Supervised()
    leader = os.pidfd_open(proc.pid)  # our unreaped child: no pid-reuse race
    reader = _Reader(streams, ready_fd, status_fd, leader)
    trigger = None
    try:
        leader_exited = False
        while not leader_exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                out.timed_out, out.killed_reason = True, "timeout"
                break
            for key, _ in reader.sel.select(remaining):
                if key.fd == leader:
                    leader_exited = True
                else:
                    reader.read(key.fd)
            if reader.output_bytes() > max_stream_bytes:
                out.killed_reason = "output_limit"
                break
        if leader_exited:
            reader.drain(max_stream_bytes)
        else:
            trigger = min(time.monotonic(), deadline) if out.timed_out else time.monotonic()
            kill_tree(leader, proc.pid, reader.ns_pidfd)
        # rlimit mode has no pid namespace: whatever is left in the group dies with the call.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        _await_ns_init(reader.ns_pidfd)
        if trigger is not None:  # deadline (or output limit) → every process of the call gone
            out.kill_latency_s = time.monotonic() - trigger
    finally:
        reader.close()
        os.close(leader)
    out.returncode = proc.returncode
    out.status = reader.status.doc
    out.status_complete = "exit-code" in reader.status.doc
    out.ready = reader.ready
    return out


def _await_ns_init(pidfd: int | None) -> None:
    """Make sure the namespace's init (the interpreter, with ``--as-pid-1``) has exited before we return, so no
    process of the call is alive; SIGKILL it if it lingers."""
    if pidfd is None or _wait_fd(pidfd, 0.5):
        return
    with contextlib.suppress(ProcessLookupError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    _wait_fd(pidfd, 1.0)
