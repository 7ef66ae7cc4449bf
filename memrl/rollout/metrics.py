"""Namespaced rollout metrics (``rollout/...``, ``tools/...``), counted from what the backend reports; and how
finished answers used their tools (``tooluse/...``: :func:`tool_use_metrics`, per training step, per evaluation and
in ``memrl inspect``)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from memrl.formats import tagged_answer
from memrl.tools.base import ToolResult
from memrl.types import (
    EpisodeTrajectory,
    GenerationOutput,
    RollbackRecord,
    StepTrajectory,
    ToolCallRecord,
    ToolStatus,
    TurnRole,
)


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


@dataclass(frozen=True)
class AnswerToolUse:
    """How one answer used its tools. ``failed``: calls kept in the context with a non-ok result; ``rollbacks``:
    failed calls removed by tool rollback (every attempt); ``gold_calls``: calls whose output is the gold answer
    (the program computed it); ``copied``: the tagged answer is the output of the answer's last successful call."""

    calls: int = 0
    failed: int = 0
    rollbacks: int = 0
    gold_calls: int = 0
    ok_calls: int = 0
    copied: bool = False


def _same(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def answer_tool_use(
    calls: Sequence[ToolCallRecord], rollbacks: Sequence[RollbackRecord], response_text: str, gold: str | None
) -> AnswerToolUse:
    ok = [c for c in calls if c.status is ToolStatus.OK]
    answer = tagged_answer(response_text)
    return AnswerToolUse(
        calls=len(calls),
        failed=len(calls) - len(ok),
        rollbacks=sum(r.attempts for r in rollbacks),
        gold_calls=0 if gold is None else sum(_same(c.result, gold) for c in ok),
        ok_calls=len(ok),
        copied=bool(ok) and answer is not None and _same(answer, ok[-1].result),
    )


def step_tool_use(step: StepTrajectory) -> AnswerToolUse:
    """:func:`answer_tool_use` of an answer step (its ``StepMeta`` holds the calls, the rollbacks and the gold)."""
    meta = step.meta
    return answer_tool_use(meta.tool_calls, meta.rollbacks, meta.response_text, meta.gold_answer)


def episodes_tool_use(episodes: Sequence[EpisodeTrajectory]) -> list[AnswerToolUse]:
    """One :class:`AnswerToolUse` per distinct answer of ``episodes`` (target steps; a tree's duplicated leaves
    once)."""
    return [
        step_tool_use(s)
        for ep in episodes
        for s in ep.steps
        if s.turn_role is TurnRole.TARGET and not s.meta.is_duplicate
    ]


def tool_use_metrics(uses: Sequence[AnswerToolUse], prefix: str = "tooluse/") -> dict[str, float]:
    """Totals and rates over answers: ``calls_per_answer``, ``answers_with_call`` (share), ``failed_calls`` and
    ``rollbacks`` (counts) with ``failed_call_share`` (of calls), ``gold_calls`` (count) with ``gold_call_share``
    (of calls), ``copied_results`` (share of the answers with a successful call that answered with its output)."""
    n = len(uses)
    calls = sum(u.calls for u in uses)
    with_ok = [u for u in uses if u.ok_calls]
    out = {
        "answers": n,
        "calls_per_answer": calls / n if n else 0.0,
        "answers_with_call": sum(u.calls > 0 for u in uses) / n if n else 0.0,
        "failed_calls": sum(u.failed for u in uses),
        "failed_call_share": sum(u.failed for u in uses) / calls if calls else 0.0,
        "rollbacks": sum(u.rollbacks for u in uses),
        "gold_calls": sum(u.gold_calls for u in uses),
        "gold_call_share": sum(u.gold_calls for u in uses) / calls if calls else 0.0,
        "copied_results": sum(u.copied for u in with_ok) / len(with_ok) if with_ok else 0.0,
    }
    return {prefix + k: float(v) for k, v in out.items()}
