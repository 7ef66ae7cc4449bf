"""Find the tool call a model turn ended with, using the tools layer's parser registry.

The tools layer (``memrl.tools.PARSERS``) owns call parsing. Until it provides that registry, the ``tag`` format
of :mod:`memrl.formats` is parsed here (with a warning once), so rollouts do not depend on its arrival.
"""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable

from memrl.formats import TOOL_TAGS
from memrl.tools.base import ToolCall

logger = logging.getLogger(__name__)

_TAG_RE = re.compile(r"<(" + "|".join(TOOL_TAGS) + r")>(.*?)</\1>", re.DOTALL)
_warned = False


def tag_calls(text: str) -> list[ToolCall]:
    """``<python>code</python>`` / ``<search>query</search>`` calls in ``text``, in order."""
    return [
        ToolCall(name=m.group(1), arguments=m.group(2), raw=m.group(0), start=m.start(), end=m.end())
        for m in _TAG_RE.finditer(text)
    ]


def _parser(name: str) -> Callable[[str], list[ToolCall]]:
    global _warned
    registry = getattr(importlib.import_module("memrl.tools"), "PARSERS", None)
    if registry is not None:
        return registry.get(name)
    if name != "tag":
        raise ImportError(
            f"tool parser {name!r} needs memrl.tools.PARSERS, which this install does not provide"
        )
    if not _warned:
        logger.warning("memrl.tools.PARSERS is missing; parsing tool calls with the built-in 'tag' format")
        _warned = True
    return tag_calls


def parse_last_call(parser: str, turn_text: str) -> ToolCall:
    """The last call in ``turn_text`` (generation stops right after a call closes). A turn whose closing tag
    has no well-formed call yields a ``ToolCall`` with ``parse_error`` set; executing it returns the error as an
    observation (and can trigger a rollback)."""
    calls = list(_parser(parser)(turn_text))
    if calls:
        return calls[-1]
    return ToolCall(
        name="",
        arguments="",
        raw=turn_text[-200:],
        parse_error="tool call format is wrong: the turn closed a tool tag without a well-formed call",
    )
