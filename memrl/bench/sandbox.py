"""``memrl bench sandbox``: containment, overhead, kill latency, leaks and throughput of the python sandbox.

* ``cases`` / ``escapes``: the hostile suite (:mod:`memrl.testing.hostile`), judged from the host's side.
* ``overhead_ratio``: median wall time of a sandboxed ``pass`` over a bare ``python -c pass`` subprocess of
  the same interpreter, interleaved in this run (the machine is shared; only the ratio is meaningful).
* ``kill_latency_s``: p95 over timed-out calls of (call wall time − timeout), i.e. how long past its deadline a
  call takes until every process of it is gone and the result is back (max reported too).
* ``leaked_processes`` / ``leaked_fds`` after ``--runs`` calls of which ``--timeout-fraction`` loop forever.
* ``calls_per_s``: throughput of those runs with the pool at its default concurrency.
"""

from __future__ import annotations

import argparse
import logging
import random
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from memrl.bench import BENCHES
from memrl.testing.hostile import (
    CASES,
    HostProbe,
    count_fds,
    live_children,
    processes_in_pidns,
    quick_limits,
    run_case,
)
from memrl.tools.config import SandboxConfig
from memrl.tools.sandbox import Sandbox, SandboxResult

log = logging.getLogger(__name__)

QUICK = "print(sum(i * i for i in range(1000)))"
LOOP = "while True:\n    pass"


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="memrl bench sandbox")
    p.add_argument("--runs", type=int, default=1000, help="calls in the leak/throughput phase")
    p.add_argument("--timeout-fraction", type=float, default=0.1, help="share of those calls that never end")
    p.add_argument("--loop-timeout-s", type=float, default=0.3, help="timeout of the never-ending calls")
    p.add_argument("--overhead-samples", type=int, default=40)
    p.add_argument("--skip-hostile", action="store_true")
    p.add_argument("--memory-total-mb", type=int, default=0, help="per-call memory cgroup (0 = rlimits only)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _hostile(memory_total_mb: int) -> tuple[int, list[str], float]:
    t0 = time.monotonic()
    cfg = quick_limits(memory_total_mb=memory_total_mb)
    escapes: list[str] = []
    with Sandbox(cfg) as sb, HostProbe(cfg.sandbox_uid) as probe:
        for case in tqdm(CASES, desc="hostile", leave=False):
            escapes += run_case(case, sb.run, probe)
    return len(CASES), escapes, time.monotonic() - t0


def _overhead(cfg: SandboxConfig, samples: int) -> dict[str, float]:
    def bare() -> float:
        t = time.perf_counter()
        subprocess.run([cfg.python, "-c", "pass"], check=True)
        return time.perf_counter() - t

    bare_t, sand_t = [], []
    with Sandbox(cfg) as sb:
        sb.run("pass")  # warm the page cache for both
        bare()
        for _ in tqdm(range(samples), desc="overhead", leave=False):
            bare_t.append(bare())
            t = time.perf_counter()
            r = sb.run("pass")
            sand_t.append(time.perf_counter() - t)
            if r.exit_code != 0:
                raise RuntimeError(f"sandboxed 'pass' failed: {r}")
    b, s = statistics.median(bare_t), statistics.median(sand_t)
    return {"overhead_ratio": s / b, "bare_python_median_s": b, "sandbox_call_median_s": s}


def _load(cfg: SandboxConfig, args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(args.seed)
    n_loop = round(args.runs * args.timeout_fraction)
    plan = [True] * n_loop + [False] * (args.runs - n_loop)
    rng.shuffle(plan)
    fds, kids = count_fds(), live_children()
    namespaces: set[int] = set()
    results: list[tuple[bool, SandboxResult]] = []
    t0 = time.monotonic()
    with Sandbox(cfg) as sb, ThreadPoolExecutor(cfg.concurrency) as pool:

        def call(loop: bool) -> tuple[bool, SandboxResult]:
            return loop, sb.run(
                LOOP if loop else QUICK, timeout_s=args.loop_timeout_s if loop else cfg.timeout_s
            )

        for loop, r in tqdm(pool.map(call, plan), total=len(plan), desc="runs", leave=False):
            results.append((loop, r))
            if "pid_namespace" in r.extra:
                namespaces.add(r.extra["pid_namespace"])
    elapsed = time.monotonic() - t0
    leaked = {p for ns in namespaces for p in processes_in_pidns(ns)} | (set(live_children()) - set(kids))
    zombies = {p for ns in namespaces for p in processes_in_pidns(ns, zombies=True)} - leaked
    latencies = sorted(max(r.duration_s - args.loop_timeout_s, 0.0) for loop, r in results if loop)
    wrong = sum(
        1 for loop, r in results if (loop and not r.timed_out) or (not loop and r.stdout != "332833500\n")
    )
    return {
        "calls_per_s": len(plan) / elapsed,
        "runs": float(len(plan)),
        "timeouts": float(sum(r.timed_out for _, r in results)),
        "wrong_results": float(wrong),
        "kill_latency_s": latencies[int(0.95 * (len(latencies) - 1))] if latencies else 0.0,
        "kill_latency_median_s": statistics.median(latencies) if latencies else 0.0,
        "kill_latency_max_s": latencies[-1] if latencies else 0.0,
        "leaked_processes": float(len(leaked)),
        "zombies_awaiting_host_init": float(len(zombies)),
        "leaked_fds": float(count_fds() - fds),
    }


@BENCHES.register("sandbox")
def bench_sandbox(argv: list[str]) -> dict:
    args = parse_args(argv)
    # The defaults users get (timeouts of the looping calls are set per call).
    cfg = SandboxConfig(memory_total_mb=args.memory_total_mb)
    out: dict = {"mode": cfg.mode, "concurrency": cfg.concurrency, "memory_total_mb": cfg.memory_total_mb}
    if args.skip_hostile:
        out.update(cases=0, escapes=0)
    else:
        cases, escapes, secs = _hostile(args.memory_total_mb)
        out.update(cases=cases, escapes=len(escapes), escape_details=escapes, hostile_s=secs)
    out.update(_overhead(cfg, args.overhead_samples))
    out.update(_load(cfg, args))
    return out
