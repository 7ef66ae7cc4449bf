from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SandboxConfig:
    """Limits for model-written python (owned by memrl.tools)."""

    mode: str = "bwrap"
    timeout_s: float = 5.0
    concurrency: int = 2


@dataclass
class ToolsConfig:
    enabled: list[str] = field(default_factory=lambda: ["python", "search"])
    parser: str = "tag"
    max_output_chars: int = 1024
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
