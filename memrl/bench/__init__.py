"""Benchmarks: ``memrl bench NAME [options]`` prints one JSON object.

A bench is ``fn(argv: list[str]) -> dict`` registered in :data:`BENCHES`; it parses its own options and
reports ratios measured within one run (the machine is noisy; absolute times are context, not targets). Each
bench module also exposes ``parse_args(argv) -> argparse.Namespace``, and its defaults are the run
docs/benchmarks.md reports: ``memrl bench NAME --json`` reproduces the documented numbers.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from memrl.registry import Registry

BenchFn = Callable[[list[str]], dict]

BENCH_MODULES = ("batch", "memory", "policy", "sandbox", "rollout", "episodes", "extract")


def _populate() -> None:
    for name in BENCH_MODULES:
        try:
            importlib.import_module(f"memrl.bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"memrl.bench.{name}":
                raise


BENCHES: Registry[BenchFn] = Registry("benchmark", populate=_populate)


def auto_threads() -> int:
    """Torch threads for a timing: ``$MEMRL_BENCH_THREADS``, else 1 when the machine is oversubscribed (OpenMP
    threads that wait for a descheduled sibling make a step 2-3x slower than one thread), else every core."""
    env = os.environ.get("MEMRL_BENCH_THREADS")
    if env:
        return max(1, int(env))
    cores = os.cpu_count() or 1
    return 1 if os.getloadavg()[0] > cores else cores
