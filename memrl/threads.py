"""Torch's thread count, chosen from the machine's load when a command starts.

On a CPU shared with other jobs, OpenMP threads that wait for a descheduled sibling make every op slower: beside
other CPU jobs torch's default of one thread per core decodes many times slower than one thread
(docs/threads.md). So every ``memrl`` command that runs a model picks its count once, at start, and logs it:

1. ``$MEMRL_THREADS`` if set (a whole number ≥ 1);
2. else ``$OMP_NUM_THREADS`` if set (the usual OpenMP setting, respected as the user's choice);
3. else the cores other processes leave idle *now*, rounded, at least 1 and at most every core (2 cores: 2 threads
   when the machine is quiet, 1 as soon as another job keeps a core busy). "Now" is the CPU time the machine
   spent busy over a quarter of a second (``/proc/stat``), not the 1-minute load average, which lags: a job that
   ended seconds ago still counts as one busy core for a minute, so the next job in a queue would run on half the
   cores for its whole life. Where ``/proc/stat`` is missing, the load average is the fallback.

A long command (``memrl train``, ``memrl eval``) does not keep its first choice for its whole life: a train started
while another job was finishing would run on one thread long after that job ended. Between phases (each
evaluation batch, each step of an episode batch's memory writes and its answering, the warm start's passes, each
training step) it calls :func:`follow_threads`, which chooses
again from the cores *other* processes kept busy since the last check (this process's own CPU time is taken out,
its children's too, such as the sandbox's tool calls: its own work is not a reason to shrink) and logs the change
when the count moves. The override variables still win: with ``$MEMRL_THREADS`` or ``$OMP_NUM_THREADS`` set the
count never moves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from memrl.procfs import descendants, stat_fields

logger = logging.getLogger(__name__)

THREADS_ENV = "MEMRL_THREADS"


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, which a container or ``taskset`` narrows)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def load_average() -> float:
    """The 1-minute load average (0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def _cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies of all CPUs since boot, from ``/proc/stat``; ``None`` where it is unreadable."""
    try:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [float(x) for x in fh.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    if len(fields) < 5:
        return None
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_cores(window_s: float = 0.25, cores: int | None = None) -> float:
    """How many cores the machine keeps busy now (CPU time over ``window_s``; this process sleeps meanwhile),
    else the 1-minute load average."""
    import time

    first = _cpu_times()
    if first is not None:
        time.sleep(window_s)
        second = _cpu_times()
        if second is not None and second[1] > first[1]:
            share = (second[0] - first[0]) / (second[1] - first[1])
            return share * ((os.cpu_count() or 1) if cores is None else cores)
    return load_average()


def choose_threads(
    env: Mapping[str, str] | None = None, load: float | None = None, cores: int | None = None
) -> tuple[int, str]:
    """``(threads, why)`` by the rules in the module docstring; ``env``, ``load`` (busy cores) and ``cores``
    default to this process's environment, :func:`busy_cores` and :func:`available_cores`."""
    env = os.environ if env is None else env
    value = env.get(THREADS_ENV, "").strip()
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{THREADS_ENV}={value!r}: expected a whole number of threads >= 1")
        return int(value), f"{THREADS_ENV}={value}"
    omp = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()  # OpenMP allows a list per nesting level
    if omp.isdigit() and int(omp) >= 1:
        return int(omp), f"OMP_NUM_THREADS={omp}"
    cores = available_cores() if cores is None else cores
    load = busy_cores() if load is None else load
    threads = max(1, min(cores, round(cores - load)))
    return threads, f"load {load:.2f} on {cores} cores; set {THREADS_ENV} to choose"


def auto_threads() -> int:
    """The thread count :func:`choose_threads` picks here and now."""
    return choose_threads()[0]


def apply_threads(follow: bool = False) -> int:
    """Set torch's intra-op threads by :func:`choose_threads` and log the choice; returns the count. ``follow``:
    later :func:`follow_threads` calls choose again (until :func:`stop_following`)."""
    import torch

    global _FOLLOWER
    threads, why = choose_threads()
    torch.set_num_threads(threads)
    logger.info("torch threads: %d (%s)", threads, why)
    _FOLLOWER = ThreadFollower() if follow else None
    return threads


def _self_cpu_s() -> float:
    """CPU seconds this process and its descendants have used: its own threads, the children it has reaped
    (:func:`os.times`) and the live descendants (``/proc``). The sandbox runs each tool call in a child process
    (the warm start runs many gold programs); counted as another job's, they would shrink the threads of
    the very command that started them."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _live_descendants_cpu_s(os.getpid())


def _live_descendants_cpu_s(root: int) -> float:
    """CPU seconds of ``root``'s live descendants, each with the children it has reaped (utime + stime + cutime +
    cstime); 0 where ``/proc`` is missing. A descendant that ends between two readings moves from here into its
    parent's reaped-children time, so the sum stays continuous."""
    ticks = 0.0
    for pid in descendants(root):
        try:
            ticks += sum(float(x) for x in stat_fields(pid)[11:15])
        except (OSError, IndexError):
            continue  # ended meanwhile
    return ticks / os.sysconf("SC_CLK_TCK")


class OthersLoad:
    """The cores other processes kept busy between two calls: the machine's busy CPU time (``/proc/stat``) less
    this process's and its descendants' (:func:`_self_cpu_s`), over the wall time between the calls. ``None``
    where it cannot tell: no ``/proc/stat``, or less than ``min_interval_s`` since the last reading (too short to
    average)."""

    def __init__(self, cores: int | None = None, min_interval_s: float = 1.0) -> None:
        self.cores = (os.cpu_count() or 1) if cores is None else cores
        self.min_interval_s = min_interval_s
        self.jiffy_s = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01
        self._last = self._read()

    def _read(self) -> tuple[float, float, float] | None:
        times = _cpu_times()
        return None if times is None else (*times, _self_cpu_s())

    def __call__(self) -> float | None:
        now = self._read()
        last = self._last
        if now is None or last is None:
            self._last = now
            return None
        busy, total, own = (a - b for a, b in zip(now, last, strict=True))
        elapsed_s = total * self.jiffy_s / self.cores  # the jiffies of every CPU: wall time x cores
        if elapsed_s < self.min_interval_s:
            return None  # keep the reading: the next call averages over the longer interval
        self._last = now
        others = busy * self.jiffy_s - own
        return max(0.0, others / elapsed_s)


class ThreadFollower:
    """Chooses torch's threads again at each :meth:`check`, from ``load()`` (others' busy cores since the last
    check, :class:`OthersLoad`; ``None`` = no reading, keep the count); logs each change with its phase."""

    def __init__(self, load=None, env: Mapping[str, str] | None = None, cores: int | None = None) -> None:
        self.cores = available_cores() if cores is None else cores
        self.load = OthersLoad() if load is None else load
        self.env = env
        self.changes = 0

    def check(self, phase: str) -> int:
        """The thread count for ``phase`` (set in torch and logged where it changed)."""
        import torch

        current = torch.get_num_threads()
        load = self.load()
        if load is None:
            return current
        threads, why = choose_threads(env=self.env, load=load, cores=self.cores)
        if threads != current:
            torch.set_num_threads(threads)
            self.changes += 1
            logger.info("torch threads: %d -> %d before %s (%s)", current, threads, phase, why)
        else:
            logger.debug("torch threads: %d kept before %s (%s)", current, phase, why)
        return threads


_FOLLOWER: ThreadFollower | None = None


def follow_threads(phase: str) -> int | None:
    """Between phases of a long command: choose the thread count again (see the module docstring); a no-op
    (``None``) unless the command asked for it (``apply_threads(follow=True)``), so library callers and tests
    keep the threads they set."""
    return None if _FOLLOWER is None else _FOLLOWER.check(phase)


def stop_following() -> None:
    """End :func:`follow_threads`' re-checks (the command is done)."""
    global _FOLLOWER
    _FOLLOWER = None
