"""Rollout test helpers: deterministic scripts and a table-driven tool runner."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from memrl.tools.base import ToolCall, ToolResult

PROMPT = "Q: what is 1+1?\nA:"


def encode(tok, text: str) -> tuple[int, ...]:
    return tuple(tok.encode(text, add_special_tokens=False))


@dataclass
class TableTools:
    """Deterministic tool runner for state-machine tests: ``prnt(k)`` is a NameError, ``print(k)`` prints k,
    ``sleep`` times out, ``bad syntax`` is a SyntaxError. Records every batch it was given."""

    batches: list[list[ToolCall]] = field(default_factory=list)
    retries: list[str] = field(default_factory=list)

    def record_rollback(self, tool: str) -> None:
        self.retries.append(tool)

    def execute(self, calls):
        self.batches.append([c for c, _ in calls])
        return [self._one(c) for c, _ in calls]

    @staticmethod
    def _one(call: ToolCall) -> ToolResult:
        code = call.arguments.strip()
        if call.parse_error:
            return ToolResult(text=call.parse_error, status="error", error=call.parse_error)
        if m := re.fullmatch(r"print\((\d+)\)", code):
            return ToolResult(text=m.group(1), status="ok", latency_s=0.01)
        if code.startswith("prnt"):
            err = "NameError: name 'prnt' is not defined"
            return ToolResult(text=f"Traceback (most recent call last):\n{err}", status="error", error=err)
        if code == "sleep":
            return ToolResult(text="timed out after 1.0 s", status="timeout", error="timeout")
        if code == "1/0":
            err = "ZeroDivisionError: division by zero"
            return ToolResult(text=err, status="error", error=err)
        err = "SyntaxError: invalid syntax"
        return ToolResult(text=err, status="error", error=err)


def fixing_script(calls: int = 1, fix: bool = True):
    """A model that makes ``calls`` python calls, each first written wrong (``prnt``); after seeing an error
    (fed back by rollback, or left in context) it writes the corrected call; then it answers. It continues a
    partly written turn (tree branches fork mid-turn) instead of starting it again."""

    def script(ctx):
        resp = ctx.text.split("A:", 1)[1]
        cut = max(
            resp.rfind("</result>") + len("</result>"),
            resp.rfind("corrected call.\n") + len("corrected call.\n"),
            0,
        )
        done, partial = resp[:cut], resp[cut:]
        ok = len(re.findall(r"<result>\d+</result>", done))
        last = done.rfind("<result>")
        saw_error = last >= 0 and not re.match(r"<result>\d+</result>", done[last:])
        if saw_error and fix:
            turn = f"<python>print({ok + 1})</python>"
        elif ok >= calls:
            turn = f"<answer>{ok}</answer>"
        else:
            turn = f"<python>prnt({ok + 1})</python>"
        return turn[len(partial) :] if turn.startswith(partial) else turn

    return script
