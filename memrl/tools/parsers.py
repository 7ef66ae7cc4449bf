"""Tool-call parsers: model text → ``list[ToolCall]`` in text order (registry :data:`PARSERS`).

* ``tag``: ``<python>code</python>``, ``<search>query</search>``.
* ``hermes``: ``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``.

A malformed call becomes a ``ToolCall`` whose ``parse_error`` says what was expected; it is never raised.
Text inside injected `` <result>…</result>`` observations is skipped, so tool output cannot plant calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

from memrl.formats import RESULT_CLOSE, RESULT_OPEN, TOOL_TAGS
from memrl.registry import Registry
from memrl.tools.base import ToolCall

Parser = Callable[[str], list[ToolCall]]
PARSERS: Registry[Parser] = Registry("tool-call parser")

_RESULT_RE = re.compile(
    re.escape(RESULT_OPEN.strip()) + r".*?(?:" + re.escape(RESULT_CLOSE) + r"|\Z)", re.DOTALL
)
_TAG_RE = re.compile(r"<(/?)(" + "|".join(map(re.escape, TOOL_TAGS)) + r")>")
_HERMES_RE = re.compile(r"<(/?)tool_call>")
# What each tool's single string argument is called in a hermes JSON call.
ARGUMENT_NAMES = {"python": "code", "search": "query"}


def _mask_results(text: str) -> str:
    """Blank out observation spans (same length, so character offsets stay valid)."""
    return _RESULT_RE.sub(lambda m: " " * len(m.group(0)), text)


def _error(raw: str, start: int, end: int, message: str, name: str = "") -> ToolCall:
    return ToolCall(name=name, arguments="", raw=raw, start=start, end=end, parse_error=message)


@PARSERS.register("tag")
def parse_tags(text: str) -> list[ToolCall]:
    """Every ``<tool>…</tool>`` span; an unclosed or stray tag, or an empty body, becomes a parse error."""
    masked = _mask_results(text)
    calls: list[ToolCall] = []
    open_tag: re.Match[str] | None = None
    for m in _TAG_RE.finditer(masked):
        closing, name = m.group(1) == "/", m.group(2)
        if open_tag is None:
            if closing:
                calls.append(
                    _error(
                        m.group(0),
                        m.start(),
                        m.end(),
                        f"tool call format is wrong: found '</{name}>' "
                        f"without a matching '<{name}>' before it; expected <{name}>...</{name}>",
                        name,
                    )
                )
            else:
                open_tag = m
            continue
        want = open_tag.group(2)
        if closing and name == want:
            calls.append(_tag_call(text, open_tag, m))
            open_tag = None
        # Any other tag inside an open call is part of its body (code may contain the string "<search>").
    if open_tag is not None:
        name = open_tag.group(2)
        calls.append(
            _error(
                text[open_tag.start() :],
                open_tag.start(),
                len(text),
                f"tool call format is wrong: '<{name}>' is never closed; expected <{name}>...</{name}>",
                name,
            )
        )
    return calls


def _tag_call(text: str, open_m: re.Match[str], close_m: re.Match[str]) -> ToolCall:
    name = open_m.group(2)
    body = text[open_m.end() : close_m.start()]
    raw = text[open_m.start() : close_m.end()]
    if not body.strip():
        what = ARGUMENT_NAMES.get(name, "argument")
        return _error(
            raw,
            open_m.start(),
            close_m.end(),
            f"tool call format is wrong: empty <{name}> call; expected the {what} between "
            f"<{name}> and </{name}>",
            name,
        )
    return ToolCall(name=name, arguments=body, raw=raw, start=open_m.start(), end=close_m.end())


@PARSERS.register("hermes")
def parse_hermes(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{json}</tool_call>``; bad JSON, missing keys or an unclosed tag → parse error."""
    masked = _mask_results(text)
    calls: list[ToolCall] = []
    open_at: re.Match[str] | None = None
    for m in _HERMES_RE.finditer(masked):
        closing = m.group(1) == "/"
        if not closing and open_at is None:
            open_at = m
        elif closing and open_at is not None:
            calls.append(_hermes_call(text, open_at.start(), open_at.end(), m.start(), m.end()))
            open_at = None
        elif closing:
            calls.append(
                _error(
                    m.group(0),
                    m.start(),
                    m.end(),
                    "tool call format is wrong: '</tool_call>' without a matching '<tool_call>'",
                )
            )
    if open_at is not None:
        calls.append(
            _error(
                text[open_at.start() :],
                open_at.start(),
                len(text),
                "tool call format is wrong: '<tool_call>' is never closed; expected "
                '<tool_call>{"name": ..., "arguments": {...}}</tool_call>',
            )
        )
    return calls


def _hermes_call(text: str, start: int, body_start: int, body_end: int, end: int) -> ToolCall:
    raw, body = text[start:end], text[body_start:body_end].strip()
    expected = 'expected {"name": "<tool>", "arguments": {"<arg>": "<string>"}}'
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return _error(
            raw,
            start,
            end,
            f"tool call format is wrong: invalid JSON ({exc.msg} at char {exc.pos}); {expected}",
        )
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return _error(raw, start, end, f"tool call format is wrong: missing string field 'name'; {expected}")
    name, args = obj["name"], obj.get("arguments")
    if isinstance(args, str):  # some models emit arguments as a JSON-encoded string
        try:
            decoded = json.loads(args)
        except json.JSONDecodeError:
            decoded = args
        args = decoded
    value = _single_argument(name, args)
    if value is None:
        key = ARGUMENT_NAMES.get(name, "<arg>")
        return _error(
            raw,
            start,
            end,
            f"tool call format is wrong: 'arguments' of {name!r} must hold one "
            f'string field, e.g. {{"{key}": "..."}} (got {json.dumps(args)[:80]})',
            name,
        )
    return ToolCall(name=name, arguments=value, raw=raw, start=start, end=end)


def _single_argument(name: str, args: object) -> str | None:
    if isinstance(args, str) and args.strip():
        return args
    if not isinstance(args, dict):
        return None
    key = ARGUMENT_NAMES.get(name)
    if key in args and isinstance(args[key], str) and args[key].strip():
        return args[key]
    strings = [v for v in args.values() if isinstance(v, str) and v.strip()]
    return strings[0] if len(args) == 1 and strings else None
