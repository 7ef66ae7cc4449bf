"""Format reward: is the response well-formed under the memrl response conventions (``memrl.formats``)?

Well-formed = a sequence of zero or more ``<tool>…</tool>`` calls each followed by its `` <result>…</result>``,
then exactly one ``<answer>…</answer>``, with no tag left open, no nested or stray tag, nothing after the
answer. :func:`format_problems` names every violation (useful in logs and tests); the reward is 1 when there
are none, else ``max(0, 1 - penalty * violations)``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from memrl.formats import ANSWER_CLOSE, ANSWER_OPEN, TOOL_TAGS
from memrl.rewards.base import REWARDS, PerItemReward, RewardContext, RewardFn, check_options

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
