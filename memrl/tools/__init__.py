"""Tools for target turns: parsers (``PARSERS``), tools (``TOOLS``: python sandbox, memory search) and the
parallel :class:`ToolExecutor` with per-tool metrics.

    calls = PARSERS.get(cfg.rollout.tool_parser)(turn_text)         # list[ToolCall], malformed → parse_error
    with ToolExecutor(cfg.tools) as tools:
        results = tools.execute([(c, ToolContext(memory=mgr)) for c in calls])   # list[ToolResult], in order
        tools.metrics()                                       # {"tools/python/calls": ..., ...}

Isolation: :mod:`memrl.tools.launchers` (bubblewrap + rlimits + seccomp), :mod:`memrl.tools.process`
(capped reading, deadline kill, reaping), :mod:`memrl.tools.cgroup` (optional per-call memory cgroup);
:mod:`memrl.testing.hostile` holds the hostile programs the tests and ``memrl bench sandbox`` run."""

from memrl.tools.base import Tool, ToolCall, ToolInfraError, ToolResult
from memrl.tools.builtin import TOOLS, MemoryLike, ToolContext
from memrl.tools.config import SandboxConfig, ToolsConfig
from memrl.tools.executor import ToolExecutor, ToolMetrics
from memrl.tools.parsers import PARSERS
from memrl.tools.sandbox import Sandbox, SandboxResult

__all__ = [
    "PARSERS",
    "TOOLS",
    "MemoryLike",
    "Sandbox",
    "SandboxConfig",
    "SandboxResult",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolExecutor",
    "ToolInfraError",
    "ToolMetrics",
    "ToolResult",
    "ToolsConfig",
]
