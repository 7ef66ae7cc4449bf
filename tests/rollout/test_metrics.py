"""How answers used their tools (``tooluse/...``): calls, failures, rollbacks, gold calls, copied results."""

from __future__ import annotations

import pytest

from memrl.rollout.metrics import answer_tool_use, tool_use_metrics
from memrl.types import RollbackRecord, ToolCallRecord


def _call(result: str, status: str = "ok") -> ToolCallRecord:
    return ToolCallRecord(name="python", arguments="print(1)", result=result, status=status, position=3)


def test_answer_tool_use_counts_failures_rollbacks_gold_calls_and_a_copied_result():
    calls = [_call("NameError: name 'x' is not defined", "error"), _call("8171\n")]
    rollbacks = [RollbackRecord(position=0, error="SyntaxError", attempts=2, tokens_removed=9, repaired=True)]
    use = answer_tool_use(
        calls, rollbacks, "<python>..</python> <result>8171</result><answer> 8171</answer>", "8171"
    )
    assert (use.calls, use.failed, use.rollbacks, use.gold_calls, use.ok_calls, use.copied) == (
        2,
        1,
        2,
        1,
        1,
        True,
    )
    # An answer other than the result did not copy it; a result other than the gold is no gold call.
    other = answer_tool_use([_call("8170")], [], "<answer>8171</answer>", "8171")
    assert (other.gold_calls, other.copied) == (0, False)
    # An untagged answer copies nothing; without a gold answer nothing is a gold call.
    assert not answer_tool_use([_call("5")], [], "5", None).copied
    assert answer_tool_use([_call("5")], [], "<answer>5</answer>", None).gold_calls == 0


def test_tool_use_metrics_are_rates_over_answers_and_calls():
    uses = [
        answer_tool_use([_call("12"), _call("oops", "timeout")], [], "<answer>12</answer>", "12"),
        answer_tool_use([_call("7")], [], "<answer>9</answer>", "9"),
        answer_tool_use([], [], "<answer>3</answer>", "3"),
    ]
    m = tool_use_metrics(uses)
    assert m["tooluse/answers"] == 3 and m["tooluse/calls_per_answer"] == pytest.approx(1.0)
    assert m["tooluse/answers_with_call"] == pytest.approx(2 / 3)
    assert m["tooluse/failed_calls"] == 1 and m["tooluse/failed_call_share"] == pytest.approx(1 / 3)
    assert m["tooluse/gold_calls"] == 1 and m["tooluse/gold_call_share"] == pytest.approx(1 / 3)
    # Of the two answers with a successful call, the first copied its last successful call's output ("12").
    assert m["tooluse/copied_results"] == pytest.approx(0.5)
    assert tool_use_metrics([], "eval/tooluse/")["eval/tooluse/calls_per_answer"] == 0.0
