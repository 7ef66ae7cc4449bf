from __future__ import annotations

from types import SimpleNamespace

import pytest

from memrl.bench.rollout import _rollback_workload


def test_rollback_keeps_context_shorter_than_keeping_failures():
    out = _rollback_workload(SimpleNamespace(calls=2))
    # Every call is first written wrong and repaired after one rollback: 4 prompts x 4 leaves x 2 calls.
    assert out["rollbacks"] == out["rollback_repairs"] == 32
    assert 0 < out["rollback_response_ratio"] < out["rollback_context_ratio"] < 1
    assert out["rollback_context_tokens"] < out["kept_failures_context_tokens"]


def _args(*argv: str):
    from memrl.bench.rollout import parser

    small = ["--model", "random", "--prompts", "2", "--leaves", "6", "--max-tokens", "24", "--repeats", "1"]
    tree = ["--expansion-iterations", "1", "--segment-tokens", "8"]  # 1 chain + 1 round x 5 forks = 6 leaves
    return parser().parse_args([*small, *tree, *argv])


def test_tree_vs_chain_reports_both_granularities_in_one_run():
    from memrl.bench.rollout import _tree_vs_chain

    out = _tree_vs_chain(_args())
    assert out["chain"]["leaves"] == out["tree"]["leaves"] == out["tree_segment"]["leaves"] == 12
    # Random model, eos off: every leaf is 24 tokens. The tree's 5 forks continue from their fork point, so it
    # forwards fewer tokens per leaf than 6 independent chains (whose prompt is computed once too).
    assert out["chain"]["mean_response_tokens"] == out["tree"]["mean_response_tokens"] == 24
    assert 0 < out["token_ratio"] < 1 and 0 < out["alt_token_ratio"] < 1
    # Equal leaf lengths: per response token is the same ratio as per leaf.
    assert out["wall_ratio_per_response_token"] == pytest.approx(out["wall_ratio"])
    assert out["prefix_hit_rate"] > 0 and out["config"]["tree"]["branch_at"] == "token"
    assert out["alt_branch_at"] == "segment"
    assert out["tree"]["stream_waits"] > 0 and out["tree"]["generate_calls"] == 0  # the tree ran on a stream


def test_synthetic_workload_builds_pipeline_prompts_and_runs_tool_turns():
    from memrl.bench.rollout import _workload
    from memrl.data.adapters import run_adapter
    from memrl.testing import byte_tokenizer
    from memrl.tools.base import ToolCall

    tok = byte_tokenizer()
    requests, tools = _workload("synthetic", tok, 3)
    assert len(requests) == 3 and len({r.prompt_ids for r in requests}) == 3
    episodes, _ = run_adapter("synthetic", None, split="test", options={"num_episodes": 3, "seed": 0})
    for req, ep in zip(requests, episodes, strict=True):
        text = tok.decode(req.prompt_ids)
        assert ep.final_query in text and text.endswith("<|assistant|>\n")
        gold = [t for t in ep.history if t.turn_id in ep.metadata["evidence_turn_ids"]]
        assert all(t.text in text for t in gold)  # the gold facts are in the prompt
    [res] = tools.execute([(ToolCall(name="python", arguments="print(17 + 25)", raw=""), None)])
    assert res.status == "ok" and res.text == "42"
    with pytest.raises(ValueError, match="valid: locomo, synthetic"):
        _workload("locomo10", tok, 1)


def test_arithmetic_tool_runs_only_integer_prints():
    from memrl.bench.rollout import arithmetic_tool

    assert arithmetic_tool("print(19 + 5)") == "24"
    assert arithmetic_tool("print(288 - 111 * 2)") == str(288 - 222)
    assert arithmetic_tool("import os").startswith("Error")
    assert arithmetic_tool("print(__import__('os'))").startswith("Error")
