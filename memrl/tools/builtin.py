"""Built-in tools (registry :data:`TOOLS`): ``python`` (sandboxed) and ``search`` (the episode's memory).

A tool factory takes the :class:`ToolsConfig` and returns a callable ``tool(call, context) -> ToolResult``
with a ``name`` and ``close()``. Results are raw here; the executor truncates and neutralises them.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from memrl.registry import Registry
from memrl.tools.base import Tool, ToolCall, ToolInfraError, ToolResult
from memrl.tools.config import ToolsConfig
from memrl.tools.sandbox import Sandbox, SandboxResult
from memrl.tools.text import exception_line
from memrl.types import ToolStatus

ToolFactory = Callable[[ToolsConfig], Tool]
TOOLS: Registry[ToolFactory] = Registry("tool")


class FactLike(Protocol):
    """What the search tool reads from a retrieved fact (``memrl.memory.manager.RetrievedFact`` fits)."""

    fact_id: Any
    text: str
    timestamp: str | None
    source_ids: Sequence[str]
    score: float


class MemoryLike(Protocol):
    def retrieve(self, query: str, k: int) -> Sequence[FactLike]: ...


@dataclass
class ToolContext:
    """Per-call context the caller passes with each call. ``memory`` is the episode's MemoryManager (or any
    object with ``retrieve(query, k)``); tools that need nothing ignore the context."""

    memory: MemoryLike | None = None
    episode_id: str = ""
    turn_id: str = ""


def memory_of(context: Any) -> MemoryLike | None:
    """The context's memory: ``context.memory``, or the context itself when it can ``retrieve``."""
    mem = getattr(context, "memory", None)
    if mem is not None:
        return mem
    return context if callable(getattr(context, "retrieve", None)) else None


def _python_error(r: SandboxResult, timeout_s: float) -> tuple[ToolStatus, str | None]:
    """(status, error line) of a finished sandbox call."""
    if r.timed_out:
        return (
            ToolStatus.TIMEOUT,
            f"TimeoutError: execution exceeded the {timeout_s:g} s limit and was killed",
        )
    if r.killed_reason == "output_limit":
        return (
            ToolStatus.ERROR,
            f"OutputLimitError: more than {r.stdout_bytes + r.stderr_bytes} bytes of output; killed",
        )
    if r.exit_code == 0:
        return ToolStatus.OK, None
    found = exception_line(r.stderr)
    if found:
        return ToolStatus.ERROR, found
    code = r.exit_code or 0
    if code > 128 and code - 128 in signal.Signals._value2member_map_:
        name = signal.Signals(code - 128).name
        hint = {
            "SIGXCPU": " (CPU time limit)",
            "SIGSEGV": " (segmentation fault)",
            "SIGKILL": " (CPU time limit?)",
        }.get(name, "")
        return ToolStatus.ERROR, f"ProcessKilled: the program was killed by {name}{hint}"
    return ToolStatus.ERROR, f"ExitError: the program exited with status {code}"


@TOOLS.register("python")
class PythonTool:
    """Runs the call's code in the sandbox; stdout then stderr is the observation."""

    name = "python"

    def __init__(self, cfg: ToolsConfig) -> None:
        self.cfg = cfg
        self.sandbox = Sandbox(cfg.sandbox)

    def __call__(self, call: ToolCall, context: Any) -> ToolResult:
        t0 = time.monotonic()
        r = self.sandbox.run(call.arguments)
        status, error = _python_error(r, self.cfg.sandbox.timeout_s)
        parts = [p for p in (r.stdout, r.stderr) if p]
        if error and (not r.stderr or error not in r.stderr):
            parts.append(error)
        text = "\n".join(p.rstrip("\n") for p in parts) or "(no output; print() what you want to see)"
        extra = {
            "exit_code": r.exit_code,
            "killed_reason": r.killed_reason,
            "kill_latency_s": r.kill_latency_s,
        }
        return ToolResult(text=text, status=status, error=error, latency_s=time.monotonic() - t0, extra=extra)

    def close(self) -> None:
        self.sandbox.close()


@TOOLS.register("search")
class SearchTool:
    """Queries the episode's memory: one line per fact, ``[fact ID] (DATE) TEXT (sources: ...)``."""

    name = "search"

    def __init__(self, cfg: ToolsConfig) -> None:
        self.k = cfg.search_k
        # Retrieval encodes with a shared embedder; one query at a time keeps it off the thread pool's toes.
        self._lock = threading.Lock()

    def __call__(self, call: ToolCall, context: Any) -> ToolResult:
        t0 = time.monotonic()
        memory = memory_of(context)
        if memory is None:
            raise ToolInfraError(
                "search tool called without a memory: pass a context with .memory (a MemoryManager) or a "
                "MemoryManager itself as the call's context"
            )
        query = call.arguments.strip()
        with self._lock:
            facts = list(memory.retrieve(query, self.k))
        text = "\n".join(_fact_line(f) for f in facts) if facts else f"no facts found for {query!r}"
        ids = [getattr(f, "fact_id", None) for f in facts]
        return ToolResult(
            text=text, status=ToolStatus.OK, latency_s=time.monotonic() - t0, extra={"fact_ids": ids}
        )

    def close(self) -> None:
        pass


def _fact_line(fact: FactLike) -> str:
    when = f" ({fact.timestamp})" if getattr(fact, "timestamp", None) else ""
    sources = tuple(getattr(fact, "source_ids", ()) or ())
    src = f" (sources: {', '.join(map(str, sources))})" if sources else ""
    return f"[fact {fact.fact_id}]{when} {fact.text}{src}"
