"""A process's tree from Linux's ``/proc``: shared by the thread follower (its children's CPU time), the engines
bench (their memory) and the sandbox checks (stray processes)."""

from __future__ import annotations

import os


def stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name (which may hold spaces and parentheses): ``[0]`` state,
    ``[1]`` ppid, ``[11:15]`` utime stime cutime cstime in clock ticks. Raises ``OSError`` once the process is
    gone."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def descendants(pid: int | None = None) -> list[int]:
    """Every descendant of ``pid`` (default: this process), zombies included, from each thread's ``children``
    list; a process that ends during the walk is left out. Empty where ``/proc`` is missing."""
    out: list[int] = []
    todo = [os.getpid() if pid is None else pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{p}/task/{task}/children", encoding="ascii") as fh:
                    kids = [int(c) for c in fh.read().split()]
            except (OSError, ValueError):
                continue
            out.extend(kids)
            todo.extend(kids)
    return out
