"""Tools for target turns: parsers (``PARSERS``), tools (``TOOLS``: python sandbox, memory search) and the
parallel :class:`ToolExecutor` with per-tool metrics. See :mod:`memrl.tools.sandbox` for the isolation."""

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
