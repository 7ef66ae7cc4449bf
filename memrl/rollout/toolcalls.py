"""Find the tool calls a model turn made, using the tools layer's parser registry, and where each one ends."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from memrl.tools import PARSERS
from memrl.tools.base import ToolCall

_FORMAT_ERROR = "tool call format is wrong: the turn closed a tool tag without a well-formed call"


def parse_turn_calls(parser: str, turn_text: str, *, closed_tag: bool) -> list[ToolCall]:
    """Every call of a turn, in text order. ``closed_tag``: generation stopped on a tool tag's closing string, so
    the turn is a call even when none parses (then one call with ``parse_error`` set, which executes to that
    error and the default ``rollback_on_errors`` rolls back). Otherwise (the turn ended at end of sequence, as a
    hermes-style model ends a turn of parallel calls) the turn is a call turn only if one call is well formed."""
    calls = PARSERS.get(parser)(turn_text)
    if closed_tag:
        return calls or [ToolCall(name="", arguments="", raw=turn_text[-200:], parse_error=_FORMAT_ERROR)]
    return calls if any(c.parse_error is None for c in calls) else []


def token_end(decode: Callable[[Sequence[int]], str], tokens: Sequence[int], chars: int) -> int:
    """The fewest leading ``tokens`` whose decoded text covers the first ``chars`` characters (binary search:
    decoded length grows with the token count)."""
    lo, hi = 0, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(tokens[:mid])) >= chars:
            hi = mid
        else:
            lo = mid + 1
    return lo
