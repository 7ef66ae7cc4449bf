"""Tool-layer contracts: parsed calls, results as observations, and the tool signature.

A failing tool is an *observation* (``ToolResult.status`` is not :attr:`ToolStatus.OK`; the exception text is in
``error`` and ``text``), never an exception; broken infrastructure raises :class:`ToolInfraError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from memrl.types import ToolStatus


class ToolInfraError(RuntimeError):
    """The tool machinery itself is broken (sandbox cannot start, pool shut down)."""


@dataclass(frozen=True)
class ToolCall:
    """A call parsed from model text. ``parse_error`` is set (and ``name`` may be empty) when the model wrote a
    malformed call; executing it yields an error result saying what was expected."""

    name: str
    arguments: str
    raw: str
    start: int = 0  # character span of the call inside the parsed text
    end: int = 0
    parse_error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    """``text`` is what gets fed back to the model (already truncated head+tail), tokenised once by the caller."""

    text: str
    status: ToolStatus
    error: str | None = None
    latency_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # A user tool may return the plain value ("ok"); every caller compares enum members.
        object.__setattr__(self, "status", ToolStatus(self.status))


class Tool(Protocol):
    name: str

    def __call__(self, call: ToolCall, context: Any) -> ToolResult: ...
