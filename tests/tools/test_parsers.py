"""Tool-call parsers: well-formed calls, precise errors for malformed ones, results never parsed."""

from __future__ import annotations

import json

import pytest

from memrl.formats import format_result, format_tool_call
from memrl.registry import RegistryError
from memrl.tools import PARSERS


def test_tag_parser_finds_calls_in_order_with_spans():
    text = "think <python>print(1)</python> then <search>when did Ann move?</search>"
    calls = PARSERS.get("tag")(text)
    assert [(c.name, c.arguments) for c in calls] == [
        ("python", "print(1)"),
        ("search", "when did Ann move?"),
    ]
    assert all(c.parse_error is None for c in calls)
    assert [text[c.start : c.end] for c in calls] == [c.raw for c in calls]


def test_tag_parser_skips_text_inside_results():
    text = format_tool_call("python", "print('<search>x</search>')") + format_result("<search>x</search>")
    calls = PARSERS.get("tag")(text)
    assert len(calls) == 1 and calls[0].arguments == "print('<search>x</search>')"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<python>print(1)", "'<python>' is never closed; expected <python>...</python>"),
        ("print(1)</python>", "found '</python>' without a matching '<python>'"),
        ("<python>  \n</python>", "empty <python> call; expected the code between <python> and </python>"),
        ("<search></search>", "empty <search> call; expected the query between"),
    ],
)
def test_tag_parser_malformed_calls_say_what_was_expected(text, expected):
    (call,) = PARSERS.get("tag")(text)
    assert call.parse_error is not None and expected in call.parse_error
    assert call.parse_error.startswith("tool call format is wrong")  # the default rollback pattern


def test_hermes_parser_accepts_dict_and_string_arguments():
    a = json.dumps({"name": "python", "arguments": {"code": "print(2)"}})
    b = json.dumps({"name": "search", "arguments": json.dumps({"query": "tea"})})
    calls = PARSERS.get("hermes")(f"<tool_call>{a}</tool_call>\n<tool_call>{b}</tool_call>")
    assert [(c.name, c.arguments, c.parse_error) for c in calls] == [
        ("python", "print(2)", None),
        ("search", "tea", None),
    ]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("{bad json", "invalid JSON"),
        ('{"arguments": {"code": "1"}}', "missing string field 'name'"),
        ('{"name": "python", "arguments": {"code": 1}}', 'must hold one string field, e.g. {"code": "..."}'),
        ('{"name": "python", "arguments": {"a": "1", "b": "2"}}', "must hold one string field"),
    ],
)
def test_hermes_parser_malformed_json(body, expected):
    (call,) = PARSERS.get("hermes")(f"<tool_call>{body}</tool_call>")
    assert call.parse_error is not None and expected in call.parse_error


def test_hermes_unclosed_call():
    (call,) = PARSERS.get("hermes")('<tool_call>{"name": "python"')
    assert "never closed" in call.parse_error


def test_unknown_parser_lists_choices():
    with pytest.raises(RegistryError, match="hermes, tag"):
        PARSERS.get("xml")
