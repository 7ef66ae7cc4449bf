"""The text conventions shared by the prompt template, the tools layer, the rollout and the rewards.

A target-turn response is: zero or more tool calls, each answered by injected result text, then the answer::

    <python>print(41 + 1)</python> <result>42</result><answer>42</answer><eos>

Tool-call tags: ``<python>code</python>`` and ``<search>query</search>``; the injected observation is
`` <result>…</result>`` (mask 0 in training). The final answer sits in ``<answer>…</answer>``.
"""

from __future__ import annotations

import re

ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
RESULT_OPEN, RESULT_CLOSE = " <result>", "</result>"
TOOL_TAGS = ("python", "search")
# Generation stops right after a tool call closes so the tool can run (and after the answer closes).
TOOL_STOP_STRINGS = tuple(f"</{t}>" for t in TOOL_TAGS)
ANSWER_STOP_STRINGS = (ANSWER_CLOSE,)

_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.DOTALL)
_TOOL_SEGMENT_RE = re.compile(
    r"<(python|search)>.*?</\1>|" + re.escape(RESULT_OPEN.strip()) + r".*?" + re.escape(RESULT_CLOSE),
    re.DOTALL,
)


def tagged_answer(text: str) -> str | None:
    """The last complete ``<answer>…</answer>`` (stripped), or ``None`` when the response has none."""
    found = _ANSWER_RE.findall(text)
    return found[-1].strip() if found else None


def strip_tool_segments(text: str) -> str:
    """The response without its tool calls and injected results: what the model said in its own words."""
    return _TOOL_SEGMENT_RE.sub("", text).strip()


def extract_answer(text: str) -> str:
    """The last ``<answer>…</answer>`` if present, else the text with tool segments removed (stripped).

    The fallback lets content scores (token F1, lenient match) credit an instruct model that answers in
    prose; strict exact match ignores it (see :func:`tagged_answer`)."""
    found = tagged_answer(text)
    if found is not None:
        return found
    return strip_tool_segments(text).replace(ANSWER_OPEN, "").strip()


def format_answer(answer: str) -> str:
    return f"{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def format_tool_call(tool: str, body: str) -> str:
    return f"<{tool}>{body}</{tool}>"


def format_result(text: str) -> str:
    return f"{RESULT_OPEN}{text}{RESULT_CLOSE}"
