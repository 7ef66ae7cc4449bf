"""Find the tool call a model turn ended with, using the tools layer's parser registry."""

from __future__ import annotations

import importlib

from memrl.tools.base import ToolCall


def _parser(name: str):
    tools = importlib.import_module("memrl.tools")
    registry = getattr(tools, "PARSERS", None)
    if registry is None:
        raise ImportError("memrl.tools has no PARSERS registry (the tools layer is not installed correctly)")
    return registry.get(name)


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
