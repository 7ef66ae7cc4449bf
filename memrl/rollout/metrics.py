"""Namespaced rollout metrics (``rollout/...``, ``tools/...``), counted from what the backend reports."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from memrl.tools.base import ToolResult
from memrl.types import GenerationOutput


class RolloutMetrics:
    """Counters plus a few maxima. Token accounting per request: ``prefill`` = prompt tokens not served from a
    prefix cache (once per request: its ``n`` samples share the prompt), ``decode`` = generated tokens;
    ``forwarded`` = prefill + decode is the work the model did."""

    def __init__(self) -> None:
        self.values: dict[str, float] = defaultdict(float)

    def add(self, key: str, value: float) -> None:
        self.values[key] += value

    def maximum(self, key: str, value: float) -> None:
        self.values[key] = max(self.values.get(key, 0.0), value)

    def count_request(self, prompt_len: int, outs: Sequence[GenerationOutput]) -> None:
        cached = min(o.cached_tokens for o in outs) if outs else 0
        decode = sum(len(o.token_ids) for o in outs)
        self.add("rollout/prompt_tokens", prompt_len)
        self.add("rollout/cached_tokens", cached)
        self.add("rollout/prefill_tokens", prompt_len - cached)
        self.add("rollout/decode_tokens", decode)
        self.add("rollout/forwarded_tokens", prompt_len - cached + decode)

    def count_tool(self, result: ToolResult) -> None:
        # Per-tool latency and success counters live in the executor (tools/<tool>/...); these are per rollout.
        self.add("rollout/tool_calls", 1)
        self.add(f"rollout/tool_status/{result.status.value}", 1)

    def summary(self) -> dict[str, float]:
        out = dict(self.values)
        prompt = out.get("rollout/prompt_tokens", 0.0)
        out["rollout/prefix_hit_rate"] = out.get("rollout/cached_tokens", 0.0) / prompt if prompt else 0.0
        for key in ("tools/rollbacks", "tools/rollback_repairs", "tools/rollback_terminations"):
            out.setdefault(key, 0.0)
        return out
