"""Which tool failures trigger a rollback, and the one-line error recorded for them."""

from __future__ import annotations

from memrl.rollout.config import RollbackConfig
from memrl.tools.base import ToolResult
from memrl.types import ToolStatus


def error_text(result: ToolResult) -> str:
    return "\n".join(x for x in (result.error, result.text) if x)


def matches_rollback(result: ToolResult, cfg: RollbackConfig) -> bool:
    """A failed call (status not ``ok``) whose error text contains one of ``cfg.rollback_on_errors``.

    Timeouts roll back only if a pattern names them: a slow call is usually not something rewriting fixes."""
    if result.status is ToolStatus.OK:
        return False
    text = error_text(result)
    return any(pattern in text for pattern in cfg.rollback_on_errors)


def error_line(result: ToolResult, limit: int = 200) -> str:
    """The line that names the error: Python tracebacks end with ``SomeError: message``."""
    lines = [ln.strip() for ln in (result.error or result.text or "").splitlines() if ln.strip()]
    line = lines[-1] if lines else result.status.value
    return line[:limit]
