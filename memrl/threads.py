"""Torch's thread count, chosen from the machine's load when a command starts.

On a CPU shared with other jobs, OpenMP threads that wait for a descheduled sibling make every op slower: beside
other CPU jobs SmolLM2 decoded at 8 s/token with torch's default of one thread per core against 0.28 s with one
thread. So every ``memrl`` command that runs a model picks its count once, at start, and logs it:

1. ``$MEMRL_THREADS`` if set (a whole number ≥ 1);
2. else ``$OMP_NUM_THREADS`` if set (the usual OpenMP setting, respected as the user's choice);
3. else the cores other processes leave idle *now*, rounded, at least 1 and at most every core (2 cores: 2 threads
   when the machine is quiet, 1 as soon as another job keeps a core busy). "Now" is the CPU time the machine
   spent busy over a quarter of a second (``/proc/stat``), not the 1-minute load average, which lags: a job that
   ended seconds ago still counts as one busy core for a minute, so the next job in a queue would run on half the
   cores for its whole life. Where ``/proc/stat`` is missing, the load average is the fallback.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

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


def apply_threads() -> int:
    """Set torch's intra-op threads by :func:`choose_threads` and log the choice; returns the count."""
    import torch

    threads, why = choose_threads()
    torch.set_num_threads(threads)
    logger.info("torch threads: %d (%s)", threads, why)
    return threads
