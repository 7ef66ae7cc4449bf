"""Find the tool call a model turn ended with, using the tools layer's parser registry."""

from __future__ import annotations

from memrl.tools import PARSERS
from memrl.tools.base import ToolCall


def parse_last_call(parser: str, turn_text: str) -> ToolCall:
    """The last call in ``turn_text`` (generation stops right after a call closes). Malformed calls come back
    with ``parse_error`` set (the parser says what was expected); executing one returns that error as an
    observation, which the default ``rollback_on_errors`` ("tool call format is wrong") rolls back."""
    calls = PARSERS.get(parser)(turn_text)
    if calls:
        return calls[-1]
    return ToolCall(
        name="",
        arguments="",
        raw=turn_text[-200:],
        parse_error="tool call format is wrong: the turn closed a tool tag without a well-formed call",
    )
