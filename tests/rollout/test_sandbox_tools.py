"""Rollouts with the real tools layer: parser registry, ToolExecutor, python in the bubblewrap sandbox."""

from __future__ import annotations

import pytest

from memrl.rollout import RollbackConfig, RolloutConfig, RolloutRequest, run_rollout
from memrl.testing.scripted import ScriptedPolicy

# A busy host may also kill a spinning call by its CPU limit instead of the wall clock; both end the call.
from memrl.tools import ToolCall, ToolExecutor, ToolInfraError, ToolsConfig
from memrl.tools.config import SandboxConfig
from tests.rollout.rollout_fixtures import PROMPT, encode, fixing_script


@pytest.fixture(scope="module")
def executor():
    ex = ToolExecutor(ToolsConfig(enabled=["python"], sandbox=SandboxConfig(timeout_s=1.0)))
    try:
        ex.execute([(ToolCall(name="python", arguments="print(1)", raw=""), None)])
    except ToolInfraError as exc:
        ex.close()
        pytest.skip(f"sandbox unavailable here: {exc}")
    yield ex
    ex.close()


def _reqs(tok, k):
    return [RolloutRequest(encode(tok, f"#{i} {PROMPT}"), f"ep{i}") for i in range(k)]


def test_rollback_with_sandbox_errors(tok, executor):
    rb = RollbackConfig(enable_tool_rollback=True)
    cfg = RolloutConfig(strategy="chain", n=2, rollback=rb)
    executor.reset_metrics()
    result = run_rollout(_reqs(tok, 1), ScriptedPolicy(tok, fixing_script(calls=1)), executor, cfg)
    for step in result.leaves[0]:
        assert (
            tok.decode(step.response_ids) == "<python>print(1)</python> <result>1</result><answer>1</answer>"
        )
        [rec] = step.meta.rollbacks
        assert rec.error == "NameError: name 'prnt' is not defined" and rec.repaired
    assert (
        executor.metrics()["tools/python/rollbacks"] == 2 and executor.metrics()["tools/python/retries"] == 0
    )


def test_malformed_call_is_rolled_back_as_format_error(tok, executor):
    def script(ctx):
        resp = ctx.text.split("A:", 1)[1]
        if "corrected call" in resp:
            return "<python>print(5)</python>"
        return "<answer>5</answer>" if "<result>5</result>" in resp else "oops </python>"

    cfg = RolloutConfig(strategy="chain", n=1, rollback=RollbackConfig(enable_tool_rollback=True))
    [[step]] = run_rollout(_reqs(tok, 1), ScriptedPolicy(tok, script), executor, cfg).leaves
    assert tok.decode(step.response_ids) == "<python>print(5)</python> <result>5</result><answer>5</answer>"
    assert step.meta.rollbacks[0].error.startswith("tool call format is wrong")


def test_a_sandbox_timeout_does_not_stall_the_batch(tok, executor):
    def script(ctx):
        if "<result>" in ctx.text.split("A:", 1)[1]:
            return "<answer>done</answer>"
        return (
            "<python>while True: pass</python>" if ctx.text.startswith("#0") else "<python>print(2)</python>"
        )

    cfg = RolloutConfig(strategy="chain", n=2)
    pol = ScriptedPolicy(tok, script)
    result = run_rollout(_reqs(tok, 3), pol, executor, cfg)
    statuses = [[s.meta.tool_calls[0].status for s in leaves] for leaves in result.leaves]
    assert statuses[1:] == [["ok", "ok"], ["ok", "ok"]] and "timeout" in statuses[0]
    assert all(s.meta.finish == "answer" for leaves in result.leaves for s in leaves)
    # Slow and fast calls shared one tools batch and the same generate rounds: nobody waited an extra round.
    assert result.metrics["rollout/tool_calls"] == 6 and pol.stats.generate_calls == 2
