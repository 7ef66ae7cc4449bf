"""Format rewards: is the response well-formed under the memrl response conventions (``memrl.formats``)? And
``tool_call``: does it hold a call of a tool that ran?

Well-formed = a sequence of zero or more ``<tool>…</tool>`` calls each followed by its `` <result>…</result>``,
then exactly one ``<answer>…</answer>``, with no tag left open, no nested or stray tag, nothing after the
answer. :func:`format_problems` names every violation (useful in logs and tests); the reward is 1 when there
are none, else ``max(0, 1 - penalty * violations)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from memrl.formats import ANSWER_CLOSE, ANSWER_OPEN, RESULT_CLOSE, RESULT_OPEN, TOOL_TAGS
from memrl.rewards.base import (
    REWARDS,
    PerItemReward,
    RewardConfigError,
    RewardContext,
    RewardFn,
    RewardInput,
    check_options,
)
from memrl.tools.text import exception_line

_TAG_RE = re.compile(r"</?(?:" + "|".join(TOOL_TAGS) + r"|result|answer)>")


def format_problems(response: str) -> list[str]:
    """Every way ``response`` breaks the format, in order of appearance (empty list = well-formed)."""
    problems: list[str] = []
    open_tag: str | None = None
    expect_result = False
    answers = 0
    last_close_end = 0
    for m in _TAG_RE.finditer(response):
        tag = m.group(0)
        name = tag.strip("</>")
        closing = tag.startswith("</")
        if answers and not closing:
            problems.append(f"{tag} at char {m.start()} after the answer")
        if not closing:
            if open_tag is not None:
                problems.append(f"{tag} at char {m.start()} opened inside <{open_tag}>")
                continue
            if expect_result and name != "result":
                problems.append(f"tool call not followed by <result> before {tag} at char {m.start()}")
                expect_result = False
            if name == "result" and not expect_result:
                problems.append(f"<result> at char {m.start()} without a tool call before it")
            open_tag = name
            continue
        if open_tag != name:
            problems.append(
                f"{tag} at char {m.start()} closes {'nothing' if open_tag is None else '<' + open_tag + '>'}"
            )
            continue
        open_tag = None
        last_close_end = m.end()
        if name in TOOL_TAGS:
            expect_result = True
        elif name == "result":
            expect_result = False
        else:
            answers += 1
    if open_tag is not None:
        problems.append(f"<{open_tag}> never closed")
    if expect_result:
        problems.append("last tool call has no <result>")
    if answers == 0:
        problems.append(f"no {ANSWER_OPEN}…{ANSWER_CLOSE}")
    elif answers > 1:
        problems.append(f"{answers} answers (expected exactly one)")
    elif response[last_close_end:].strip():
        problems.append("text after the answer")
    return problems


@REWARDS.register("format")
def make_format(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    opts = check_options("format", options, {"penalty": 0.5})
    penalty = float(opts["penalty"])
    return PerItemReward("format", lambda x: max(0.0, 1.0 - penalty * len(format_problems(x.response))))


def _call_ran(body: str, result: str) -> bool:
    """A call with a program that ran and printed something (not an error, not the empty-output hint)."""
    out = result.strip()
    return bool(body.strip()) and bool(out) and not out.startswith(_NO_OUTPUT) and not _failed(out)


def _failed(out: str) -> bool:
    return out.startswith("tool call format is wrong") or exception_line(out) is not None


_NO_OUTPUT = "(no output"


@REWARDS.register("tool_call")
def make_tool_call(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    """1 when the response holds a well-formed call of ``tool`` (``<python>code</python>``, default) whose
    injected result is output, not an error: a format term for calling the tool at all, whatever the answer.
    ``questions: program`` (default) scores only questions whose dataset holds a program for them
    (``metadata["gold_python"]``: the synthetic task's arithmetic), so lookups are not taught to call; ``all``
    scores every question."""
    opts = check_options("tool_call", options, {"tool": "python", "questions": "program"})
    if opts["questions"] not in ("program", "all"):
        raise RewardConfigError(
            f"reward 'tool_call': questions must be 'program' or 'all', got {opts['questions']!r}"
        )
    tool = re.escape(str(opts["tool"]))
    result = re.escape(RESULT_OPEN.strip()) + "(.*?)" + re.escape(RESULT_CLOSE)
    call_re = re.compile(rf"<{tool}>(.*?)</{tool}>\s*{result}", re.DOTALL)
    every = opts["questions"] == "all"

    def score(x: RewardInput) -> float:
        if not every and "gold_python" not in x.metadata:
            return 0.0
        return float(any(_call_ran(body, result) for body, result in call_re.findall(x.response)))

    return PerItemReward("tool_call", score)
