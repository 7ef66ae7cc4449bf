"""Tool calls and rollback through the batched state machine (chain strategy, scripted policy and tools)."""

from __future__ import annotations

import json
import re

import pytest

from memrl.rollout import RollbackConfig, RolloutConfig, RolloutRequest, run_rollout
from memrl.testing.scripted import DEFAULT_LOGPROB, ScriptedPolicy
from tests.rollout.rollout_fixtures import PROMPT, TableTools, encode, fixing_script


def _run(tok, script, n=1, k=1, rollback=None, **kw):
    cfg = RolloutConfig(
        strategy=kw.pop("strategy", "chain"), n=n, rollback=rollback or RollbackConfig(), **kw
    )
    pol = ScriptedPolicy(tok, script)
    tools = TableTools()
    reqs = [RolloutRequest(encode(tok, f"#{i} {PROMPT}"), f"ep{i}") for i in range(k)]
    result = run_rollout(reqs, pol, tools, cfg)
    return result, pol, tools


def _model_text(tok, step):
    return tok.decode([t for t, m in zip(step.response_ids, step.response_mask, strict=True) if m == 1])


def _tool_text(tok, step):
    return tok.decode([t for t, m in zip(step.response_ids, step.response_mask, strict=True) if m == 0])


def test_masks_are_one_on_model_tokens_and_zero_on_tool_results(tok):
    result, _, tools = _run(tok, fixing_script(calls=1), n=3, k=2)
    for leaves in result.leaves:
        for step in leaves:
            text = tok.decode(step.response_ids)
            assert (
                text == "<python>prnt(1)</python> <result>Traceback (most recent call last):\nNameError: name"
                " 'prnt' is not defined</result><python>print(1)</python> <result>1</result><answer>1</answer>"
            )
            assert _tool_text(tok, step) == (
                " <result>Traceback (most recent call last):\nNameError: name 'prnt' is not defined</result>"
                " <result>1</result>"
            )
            assert (
                _model_text(tok, step)
                == "<python>prnt(1)</python><python>print(1)</python><answer>1</answer>"
            )
            for m, lp in zip(step.response_mask, step.logprobs, strict=True):
                assert lp == (DEFAULT_LOGPROB if m == 1 else 0.0)
            assert [r.status for r in step.meta.tool_calls] == ["error", "ok"]
            assert step.meta.rollbacks == ()
    # All 6 chains' calls went to the tools layer together, one batch per round.
    assert [len(b) for b in tools.batches] == [6, 6]


def test_rollback_replaces_the_failed_call(tok):
    rb = RollbackConfig(enable_tool_rollback=True, max_tool_retries=3)
    result, _, tools = _run(tok, fixing_script(calls=1), n=2, rollback=rb)
    for step in result.leaves[0]:
        assert (
            tok.decode(step.response_ids) == "<python>print(1)</python> <result>1</result><answer>1</answer>"
        )
        assert _model_text(tok, step) == "<python>print(1)</python><answer>1</answer>"
        [rec] = step.meta.rollbacks
        assert rec.position == 0 and rec.attempts == 1 and rec.repaired
        assert "NameError" in rec.error
        # The spliced span is exactly the corrected call: the tokens whose log-probs the trainer recomputes.
        span = step.response_ids[rec.position : rec.position + rec.repaired_tokens]
        assert tok.decode(span) == "<python>print(1)</python>"
        removed = (
            len(encode(tok, "<python>prnt(1)</python>"))
            + len(
                encode(
                    tok,
                    " <result>Traceback (most recent call last):\nNameError: name 'prnt' is not defined</result>",
                )
            )
            + len(encode(tok, rb.feedback_template.format(error=rec.error)))
        )
        assert rec.tokens_removed == removed
        assert [r.status for r in step.meta.tool_calls] == ["ok"]
        assert step.meta.tool_calls[0].arguments == "print(1)"
    m = result.metrics
    assert (
        m["tools/rollbacks"] == 2
        and m["tools/rollback_repairs"] == 2
        and m["tools/rollback_terminations"] == 0
    )
    assert m["tools/rollback_tokens_removed"] == 2 * removed
    assert tools.retries == ["python", "python"]  # counted in the tools layer's retry metric
    # The regenerated call saw the error: the tools got prnt, then print.
    assert [c.arguments for batch in tools.batches for c in batch] == ["prnt(1)"] * 2 + ["print(1)"] * 2


def test_retry_limit_terminates_and_keeps_the_last_failure(tok):
    rb = RollbackConfig(enable_tool_rollback=True, max_tool_retries=2)
    result, pol, tools = _run(tok, fixing_script(calls=1, fix=False), rollback=rb)
    [step] = result.leaves[0]
    assert step.meta.finish == "retry_limit"
    [rec] = step.meta.rollbacks
    assert rec.attempts == 3 and not rec.repaired
    assert (
        tok.decode(step.response_ids).count("<python>prnt(1)</python>") == 1
    )  # earlier attempts rolled back
    assert len(tools.batches) == 3 and pol.stats.generate_calls == 3
    assert result.metrics["tools/rollback_terminations"] == 1 and result.metrics["tools/rollbacks"] == 2


def test_retries_are_counted_per_position(tok):
    # Two call positions, each wrong once: 2 rollbacks in total although only 1 retry is allowed per position.
    rb = RollbackConfig(enable_tool_rollback=True, max_tool_retries=1)
    result, _, _ = _run(tok, fixing_script(calls=2), rollback=rb)
    [step] = result.leaves[0]
    assert step.meta.finish == "answer"
    assert [r.arguments for r in step.meta.tool_calls] == ["print(1)", "print(2)"]
    assert [(r.position, r.attempts, r.repaired) for r in step.meta.rollbacks] == [
        (0, 1, True),
        (len(encode(tok, "<python>print(1)</python> <result>1</result>")), 1, True),
    ]


def test_errors_outside_the_patterns_stay_as_observations(tok):
    rb = RollbackConfig(enable_tool_rollback=True, rollback_on_errors=["SyntaxError"])
    result, _, _ = _run(tok, fixing_script(calls=1), rollback=rb)
    [step] = result.leaves[0]
    assert step.meta.rollbacks == () and "NameError" in _tool_text(tok, step)


def test_tool_call_limit_terminates(tok):
    result, _, tools = _run(tok, lambda ctx: "<python>print(7)</python>", max_tool_calls=2)
    [step] = result.leaves[0]
    assert step.meta.finish == "tool_limit" and len(step.meta.tool_calls) == 2
    assert len(tools.batches) == 2


def test_a_timed_out_call_is_an_observation_and_the_batch_goes_on(tok):
    def script(ctx):
        resp = ctx.text.split("A:", 1)[1]
        if "<result>" in resp:
            return "<answer>done</answer>"
        return "<python>sleep</python>" if ctx.text.startswith("#0") else "<python>print(3)</python>"

    result, pol, tools = _run(tok, script, n=2, k=3)
    statuses = {
        leaves[0].request_id if hasattr(leaves[0], "request_id") else i: [
            s.meta.tool_calls[0].status for s in leaves
        ]
        for i, leaves in enumerate(result.leaves)
    }
    assert statuses == {0: ["timeout", "timeout"], 1: ["ok", "ok"], 2: ["ok", "ok"]}
    assert all(s.meta.finish == "answer" for leaves in result.leaves for s in leaves)
    assert [len(b) for b in tools.batches] == [6]  # the slow call ran alongside the others, in one batch
    assert pol.stats.generate_calls == 2


def test_response_budget_bounds_tool_results(tok):
    result, _, _ = _run(tok, lambda ctx: "<python>print(123456789)</python>", max_response_tokens=30)
    [step] = result.leaves[0]
    assert len(step.response_ids) == 30 and step.meta.finish == "length"


@pytest.mark.parametrize("strategy", ["chain", "tree"])
def test_rollback_inside_trees_and_chains(tok, strategy):
    from memrl.rollout import TreeConfig

    rb = RollbackConfig(enable_tool_rollback=True)
    tree = TreeConfig(
        initial_rollouts=2,
        expansion_iterations=1,
        # Expand every node, so some forks certainly sit mid-turn (see the reattach check).
        nodes_per_expansion=40,
        beam_size=2,
        segment_tokens=7,
    )
    result, _, _ = _run(tok, fixing_script(calls=2), n=4, rollback=rb, strategy=strategy, tree=tree)
    for step in result.leaves[0]:
        text = tok.decode(step.response_ids)
        assert "prnt" not in text
        assert text.endswith("<answer>2</answer>")
        assert all(r.repaired for r in step.meta.rollbacks)
        # Tree offsets: the span is the corrected call in the leaf's own response.
        for r in step.meta.rollbacks:
            span = tok.decode(step.response_ids[r.position : r.position + r.repaired_tokens])
            assert re.fullmatch(r"<python>print\(\d\)</python>", span), span
    if strategy == "tree":
        # Some forks sat mid-turn: their rollback reached below the fork and re-attached them higher up.
        assert result.metrics.get("rollout/tree/rollback_reattached", 0) > 0


def _hermes(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def _parallel_script(bad: bool):
    """A hermes-style model: one turn of three calls ended at eos (the third wrong when ``bad``); after the error
    feedback it rewrites only that call; once it has three results it answers."""

    def script(ctx):
        resp = ctx.text.split("A:", 1)[1]
        if "corrected call" in resp:
            return _hermes("print(3)")
        if "<result>" in resp:
            return "<answer>6</answer>"
        return _hermes("print(1)") + _hermes("print(2)") + _hermes("prnt(3)" if bad else "print(3)")

    return script


def _model_part(tok, step, start, length):
    return tok.decode(step.response_ids[start : start + length], skip_special_tokens=True)


def test_every_call_of_a_turn_runs_in_one_batch_with_results_in_order(tok):
    result, _, tools = _run(
        tok, _parallel_script(bad=False), tool_parser="hermes", max_tool_calls=4, max_response_tokens=600
    )
    [step] = result.leaves[0]
    assert [[c.arguments for c in batch] for batch in tools.batches] == [["print(1)", "print(2)", "print(3)"]]
    assert [(r.arguments, r.status, r.result) for r in step.meta.tool_calls] == [
        ("print(1)", "ok", "1"),
        ("print(2)", "ok", "2"),
        ("print(3)", "ok", "3"),
    ]
    assert _tool_text(tok, step) == " <result>1</result> <result>2</result> <result>3</result>"
    assert step.meta.finish == "answer" and step.meta.rollbacks == ()


def test_one_failing_call_of_several_is_rolled_back_while_the_others_stay(tok):
    rb = RollbackConfig(enable_tool_rollback=True, max_tool_retries=2)
    result, _, tools = _run(
        tok,
        _parallel_script(bad=True),
        tool_parser="hermes",
        max_tool_calls=4,
        rollback=rb,
        max_response_tokens=600,
    )
    [step] = result.leaves[0]
    # The two good calls ran once and kept their results; only the failed one was regenerated and run again.
    assert [[c.arguments for c in batch] for batch in tools.batches] == [
        ["print(1)", "print(2)", "prnt(3)"],
        ["print(3)"],
    ]
    assert [(r.arguments, r.status) for r in step.meta.tool_calls] == [
        ("print(1)", "ok"),
        ("print(2)", "ok"),
        ("print(3)", "ok"),
    ]
    text = tok.decode(step.response_ids, skip_special_tokens=True)
    assert "prnt" not in text and "NameError" not in text and "corrected call" not in text
    assert _tool_text(tok, step) == " <result>1</result> <result>2</result> <result>3</result>"
    [rec] = step.meta.rollbacks
    # Its checkpoint is where the previous call ends; the spliced span is the corrected call (and its eos).
    assert rec.repaired and rec.attempts == 1 and "NameError" in rec.error
    assert rec.position == len(encode(tok, _hermes("print(1)") + _hermes("print(2)")))
    assert _model_part(tok, step, rec.position, rec.repaired_tokens) == _hermes("print(3)")
    assert tools.retries == ["python"]
