"""ToolExecutor: run a batch of parsed calls in parallel, each outcome an observation, with per-tool metrics.

    with ToolExecutor(cfg.tools) as tools:
        results = tools.execute([(call, ToolContext(memory=mgr)), ...])   # input order
        tools.metrics()   # {"tools/python/calls": 3.0, "tools/python/timeouts": 1.0, ...}

Malformed calls (``parse_error``) and unknown tool names come back as ``ToolStatus.ERROR`` results saying what
was expected. Tool failures (exceptions in the code, timeouts) are results too: the model's own errors, left to
the rollout (an observation, or a rollback). Broken infrastructure (:class:`ToolInfraError`: the sandbox could
not start, its cgroup could not be set up) is not the model's fault: the call is retried with exponential backoff
up to ``tools.max_infra_retries`` times (``tools/<tool>/retries``, ``tools/max_retries``: the most one call
needed) and raised only when it keeps failing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from memrl.tools.base import Tool, ToolCall, ToolInfraError, ToolResult
from memrl.tools.builtin import TOOLS
from memrl.tools.config import ToolsConfig
from memrl.tools.text import neutralize, truncate_middle
from memrl.types import ToolStatus

log = logging.getLogger(__name__)

_COUNTERS = (
    "calls", "successes", "failures", "timeouts", "retries", "max_retries", "rollbacks", "time_total_s", "time_max_s"
)  # fmt: skip
_MAXIMA = ("time_max_s", "max_retries")
INFRA_BACKOFF_S = 0.2  # first wait before an infrastructure retry; doubles each time


class ToolMetrics:
    """Thread-safe per-tool counters, exported as ``tools/<tool>/<counter>`` plus ``tools/<counter>`` totals.

    ``failures`` counts every non-ok result (timeouts included; ``timeouts`` is the subset); malformed calls
    count under the tool they named, or ``invalid``. ``retries`` counts infrastructure retries (``max_retries``:
    the most one call needed); ``rollbacks`` is fed by the rollback layer (a failed call regenerated)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_tool: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(_COUNTERS, 0.0))

    def record(self, tool: str, result: ToolResult, retries: int = 0) -> None:
        with self._lock:
            m = self._by_tool[tool]
            m["retries"] += retries
            m["max_retries"] = max(m["max_retries"], retries)
            m["calls"] += 1
            m["successes" if result.status is ToolStatus.OK else "failures"] += 1
            m["timeouts"] += result.status is ToolStatus.TIMEOUT
            m["time_total_s"] += result.latency_s
            m["time_max_s"] = max(m["time_max_s"], result.latency_s)

    def record_rollback(self, tool: str) -> None:
        with self._lock:
            self._by_tool[tool]["rollbacks"] += 1

    def snapshot(self) -> dict[str, float]:
        with self._lock:
            out: dict[str, float] = {}
            totals = dict.fromkeys(_COUNTERS, 0.0)
            for tool, m in sorted(self._by_tool.items()):
                for k, v in m.items():
                    out[f"tools/{tool}/{k}"] = float(v)
                    totals[k] = max(totals[k], v) if k in _MAXIMA else totals[k] + v
            out.update({f"tools/{k}": float(v) for k, v in totals.items()})
            return out

    def reset(self) -> None:
        with self._lock:
            self._by_tool.clear()


class ToolExecutor:
    """Owns the enabled tools and a thread pool of ``cfg.max_parallel``; python calls additionally share the
    sandbox pool (``cfg.sandbox.concurrency`` processes at once)."""

    def __init__(self, cfg: ToolsConfig) -> None:
        self.cfg = cfg
        self.tools: dict[str, Tool] = {}
        try:
            for name in cfg.enabled:
                self.tools[name] = TOOLS.get(name)(cfg)
        except BaseException:
            self.close()
            raise
        self._metrics = ToolMetrics()
        self._pool = ThreadPoolExecutor(cfg.max_parallel, thread_name_prefix="memrl-tools")
        self._closed = False

    def execute(self, items: Sequence[tuple[ToolCall, Any]]) -> list[ToolResult]:
        """Run every ``(call, context)`` in parallel; one result per item, in input order."""
        if self._closed:
            raise ToolInfraError("ToolExecutor is closed")
        futures = [self._pool.submit(self._one, call, context) for call, context in items]
        results, failure = [], None
        for f in futures:  # wait for all before raising, so no call outlives the batch
            try:
                results.append(f.result())
            except Exception as exc:  # ToolInfraError, or a bug in a tool: raised, never turned into text
                failure = failure or exc
        if failure is not None:
            raise failure
        return results

    def _one(self, call: ToolCall, context: Any) -> ToolResult:
        if call.parse_error is not None:
            result = ToolResult(text=call.parse_error, status=ToolStatus.ERROR, error=call.parse_error)
            self._metrics.record(call.name if call.name in self.tools else "invalid", result)
            return result
        tool = self.tools.get(call.name)
        if tool is None:
            msg = f"unknown tool {call.name!r}; available tools: {', '.join(sorted(self.tools)) or '(none)'}"
            result = ToolResult(text=msg, status=ToolStatus.ERROR, error=msg)
            self._metrics.record("invalid", result)
            return result
        t0 = time.monotonic()
        raw, retries = self._run_with_retry(tool, call, context)
        raw = replace(raw, latency_s=raw.latency_s or time.monotonic() - t0)
        result = self.finalize(raw)
        self._metrics.record(call.name, result, retries)
        return result

    def _run_with_retry(self, tool: Tool, call: ToolCall, context: Any) -> tuple[ToolResult, int]:
        for attempt in range(self.cfg.max_infra_retries + 1):
            try:
                return tool(call, context), attempt
            except ToolInfraError as exc:
                if attempt == self.cfg.max_infra_retries:
                    raise
                wait = INFRA_BACKOFF_S * 2**attempt
                log.warning(
                    "tool %s: infrastructure failure (%s); retry %d in %.1f s",
                    call.name,
                    exc,
                    attempt + 1,
                    wait,
                )
                time.sleep(wait)
        raise AssertionError("unreachable")

    def finalize(self, result: ToolResult) -> ToolResult:
        """Neutralise forged tags/special tokens, then truncate to ``max_output_chars`` (head + tail)."""
        text = truncate_middle(neutralize(result.text, self.cfg.neutralize), self.cfg.max_output_chars)
        error = None if result.error is None else neutralize(result.error, self.cfg.neutralize)
        return replace(result, text=text, error=error)

    # -- metrics --------------------------------------------------------------------------------------
    def metrics(self) -> dict[str, float]:
        return self._metrics.snapshot()

    def record_rollback(self, tool: str) -> None:
        """Counted by the rollback layer each time it regenerates a failed call of ``tool``."""
        self._metrics.record_rollback(tool)

    def reset_metrics(self) -> None:
        self._metrics.reset()

    # -- lifecycle ------------------------------------------------------------------------------------
    def close(self) -> None:
        self._closed = True
        pool = getattr(self, "_pool", None)
        if pool is not None:
            pool.shutdown(wait=True)
        for tool in self.tools.values():
            close = getattr(tool, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> ToolExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
