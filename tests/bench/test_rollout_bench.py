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


def test_three_arms_report_cost_and_answer_quality_in_one_run():
    from memrl.bench.rollout import _tree_vs_chain

    out = _tree_vs_chain(_args())
    arms = ("chain", "tree", "tree_random")
    assert all(out[a]["leaves"] == 12 for a in arms)
    assert out["config"]["arms"]["tree_random"]["expansion_policy"] == "random"
    assert out["config"]["arms"]["tree"]["expansion_policy"] == "entropy"
    # Random model, eos off: every leaf is 24 tokens. The tree's 5 forks continue from their fork point, so it
    # forwards and decodes fewer tokens per leaf than 6 independent chains (whose prompt is computed once too).
    assert out["chain"]["mean_response_tokens"] == out["tree"]["mean_response_tokens"] == 24
    assert 0 < out["token_ratio"] < 1 and 0 < out["decode_token_ratio"] < 1
    assert 0 < out["tree_random_token_ratio"] < 1
    # Equal leaf lengths: per response token is the same ratio as per leaf.
    assert out["wall_ratio_per_response_token"] == pytest.approx(out["wall_ratio"])
    assert out["prefix_hit_rate"] > 0 and out["config"]["arms"]["tree"]["segment_tokens"] == 8
    assert out["tree"]["stream_waits"] > 0 and out["tree"]["generate_calls"] == 0  # the tree ran on a stream
    for arm in arms:  # a random model never writes the answer tag; the scores are computed, not assumed
        q = out[arm]
        assert q["strict_best_of_n"] == q["strict_mixed_groups"] == q["answer_tag_mean"] == 0
        assert 0 <= q["lenient_mean"] <= q["lenient_best_of_n"] <= 1
        assert 1 <= q["distinct_answers_per_group"] <= 6


def test_scores_count_best_of_n_mean_and_mixed_groups():
    from memrl.bench.rollout_workloads import Workload, score_groups
    from memrl.testing import byte_tokenizer

    tok = byte_tokenizer()

    def leaf(text):
        return SimpleNamespace(response_ids=tuple(tok.encode(text, add_special_tokens=False)))

    leaves = [
        [leaf("<answer>Lisbon</answer>"), leaf("She lives in Lisbon."), leaf("<answer>Porto</answer>")],
        [leaf("<answer>7</answer>"), leaf("<answer>7</answer>"), leaf("<answer>7</answer>")],
    ]
    work = Workload(requests=[], tools=None, golds=["Lisbon", "8"], questions=["where?", "how many?"])
    out = score_groups(tok, leaves, work)
    assert out["strict_best_of_n"] == 0.5 and out["strict_mean"] == pytest.approx(1 / 6)
    assert out["lenient_best_of_n"] == 0.5 and out["lenient_mean"] == pytest.approx(2 / 6)
    assert out["strict_mixed_groups"] == out["lenient_mixed_groups"] == 0.5
    assert out["answer_tag_mean"] == pytest.approx(5 / 6)
    # {lisbon, she lives in lisbon, porto} and {7}: (3 + 1) / 2
    assert out["distinct_answers_per_group"] == 2.0


def test_workloads_build_pipeline_prompts_with_gold_answers():
    from memrl.bench.rollout_workloads import build_workload
    from memrl.data.adapters import run_adapter
    from memrl.testing import byte_tokenizer
    from memrl.tools.base import ToolCall

    tok = byte_tokenizer()
    work = build_workload("synthetic", tok, 3)
    assert len(work.requests) == 3 and len({r.prompt_ids for r in work.requests}) == 3
    episodes, _ = run_adapter("synthetic", None, split="test", options={"num_episodes": 3, "seed": 0})
    for req, ep, gold in zip(work.requests, episodes, work.golds, strict=True):
        text = tok.decode(req.prompt_ids)
        assert ep.final_query in text and text.endswith("<|assistant|>\n") and gold == ep.target_answer
        evidence = [t for t in ep.history if t.turn_id in ep.metadata["evidence_turn_ids"]]
        assert all(t.text in text for t in evidence)  # the gold facts are in the prompt
    [res] = work.tools.execute([(ToolCall(name="python", arguments="print(17 + 25)", raw=""), None)])
    assert res.status == "ok" and res.text == "42"
    locomo = build_workload("locomo", tok, 100)  # the bundled fixture: categories 1-4 with evidence only
    assert 0 < len(locomo.requests) < 8 and locomo.tools is None and all(locomo.golds)
    assert "python" not in tok.decode(locomo.requests[0].prompt_ids)
    with pytest.raises(ValueError, match="valid: locomo, synthetic"):
        build_workload("locomo10", tok, 1)


def test_arithmetic_tool_runs_only_integer_prints():
    from memrl.bench.rollout_workloads import arithmetic_tool

    assert arithmetic_tool("print(19 + 5)") == "24"
    assert arithmetic_tool("print(288 - 111 * 2)") == str(288 - 222)
    assert arithmetic_tool("import os").startswith("Error")
    assert arithmetic_tool("print(__import__('os'))").startswith("Error")
