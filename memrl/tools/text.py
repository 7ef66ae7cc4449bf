"""Turning raw tool output into a safe observation: head+tail truncation, tag neutralisation, error lines."""

from __future__ import annotations

import re
from collections.abc import Iterable

# Strings tool output must never inject verbatim: our own tags (a forged `</result>` would end the observation
# early and let code write "model" text), hermes tags and chat-template control tokens.
_BUILTIN_PATTERN = (
    r"</?(?:result|answer|python|search|tool_call|tool_response|think)\s*>"
    r"|<\|[^|<>\n]{1,64}\|>"  # <|im_end|>, <|eot_id|>, <|endoftext|>, ...
    r"|</?s>|\[/?INST\]|<eos>|<bos>|<pad>"
)
_BUILTIN_RE = re.compile(_BUILTIN_PATTERN, re.IGNORECASE)

# "NameError: name 'x' is not defined", "json.decoder.JSONDecodeError: ...", "KeyboardInterrupt"
_EXC_LINE_RE = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b.*$"
)


def neutralize(text: str, extra: Iterable[str] = ()) -> str:
    """Escape the ``<`` / ``[`` of forged tags and special tokens (``</result>`` → ``&lt;/result>``)."""

    def esc(m: re.Match[str]) -> str:
        s = m.group(0)
        return ("&lt;" + s[1:]) if s.startswith("<") else ("&#91;" + s[1:])

    text = _BUILTIN_RE.sub(esc, text)
    for token in extra:
        if token and token in text:
            text = text.replace(token, ("&lt;" + token[1:]) if token[0] == "<" else ("\u200b".join(token)))
    return text


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail of ``text`` within ``max_chars`` with a marker saying how much was cut."""
    if len(text) <= max_chars:
        return text
    marker_room = 48
    keep = max(max_chars - marker_room, 2)
    head, tail = keep // 2, keep - keep // 2
    cut = len(text) - head - tail
    return f"{text[:head]}\n...[{cut} chars truncated]...\n{text[len(text) - tail :]}"


_TB_HEADER = "Traceback (most recent call last):"


def exception_line(stderr: str) -> str | None:
    """The ``ExcType: message`` line of the last Python traceback in ``stderr`` (``None`` if there is none).

    After the last ``Traceback`` header the first unindented line is the exception (any class name, e.g. a
    user's ``Oops: ...``); without a header (a ``SyntaxError`` from compiling) the last line that looks like
    ``SomethingError: ...`` is taken. The rollback layer regex-matches this line (e.g. ``SyntaxError``,
    ``NameError``, ``ImportError`` ...).
    """
    at = stderr.rfind(_TB_HEADER)
    if at >= 0:
        for line in stderr[at + len(_TB_HEADER) :].splitlines():
            if line.strip() and not line[0].isspace():
                return line.strip()
    for line in reversed(stderr.splitlines()):
        line = line.strip()
        if line and _EXC_LINE_RE.match(line):
            return line
    return None
