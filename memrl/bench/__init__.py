"""Benchmarks: ``memrl bench NAME [options]`` prints one JSON object.

A bench is ``fn(argv: list[str]) -> dict`` registered in :data:`BENCHES`; it parses its own options and
reports ratios measured within one run (the machine is noisy; absolute times are context, not targets). Each
bench module also exposes ``parse_args(argv) -> argparse.Namespace``, and its defaults are the run
docs/benchmarks.md reports: ``memrl bench NAME --json`` reproduces the documented numbers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from memrl.registry import Registry

BenchFn = Callable[[list[str]], dict]

BENCH_MODULES = (
    "batch",
    "memory",
    "policy",
    "lora",
    "sandbox",
    "rollout",
    "episodes",
    "extract",
    "engines",
    "parity",
    "attention",
)


def _populate() -> None:
    for name in BENCH_MODULES:
        try:
            importlib.import_module(f"memrl.bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"memrl.bench.{name}":
                raise


BENCHES: Registry[BenchFn] = Registry("benchmark", populate=_populate)
