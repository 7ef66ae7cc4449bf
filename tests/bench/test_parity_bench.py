"""``memrl bench parity``'s comparison of two engines' trajectories (the runs themselves need the vLLM env)."""

from __future__ import annotations

import math

import pytest

from memrl.bench.parity import compare, parse_args


def _row(step, role, ids, lps, ops="[]", retrieved=(1, 2), text="x"):
    return {"turn_role": role, "response_ids": list(ids), "logprobs": list(lps), "memory_ops": ops,
            "retrieved_ids": list(retrieved), "response_text": text}  # fmt: skip


def test_compare_counts_equal_rows_memory_and_the_logprob_gap_per_kind():
    hf = {
        ("e0", "w0"): _row("w0", "history", [5, 6], [-0.1, -0.2], ops='["ADD a"]'),
        ("e0", "t"): _row("t", "target", [7], [-1.0]),
        ("e1", "w0"): _row("w0", "history", [5, 6], [-0.1, math.nan], ops='["ADD b"]', text="ADD b"),
        ("e1", "t"): _row("t", "target", [8], [-2.0], retrieved=(3,)),
    }
    vl = dict(hf)
    vl[("e0", "w0")] = _row("w0", "history", [5, 6], [-0.1004, -0.2], ops='["ADD a"]')
    vl[("e1", "w0")] = _row("w0", "history", [5, 9], [-0.1, -0.3], ops='["ADD c"]', text="ADD c")
    vl[("e1", "t")] = _row("t", "target", [8], [-2.0], retrieved=(4,))
    got = compare(hf, vl)
    writes, answers = got["by_kind"]["writes"], got["by_kind"]["answers"]
    assert (writes["rows"], writes["tokens_equal"], writes["memory_equal"]) == (2, 1, 1)
    assert writes["max_abs_logprob_diff"] == pytest.approx(0.0004)
    assert (answers["rows"], answers["tokens_equal"], answers["memory_equal"]) == (2, 2, 1)
    assert got["first_differences"] == [{"episode": "e1", "step": "w0", "hf": "ADD b", "vllm": "ADD c"}]


def test_compare_refuses_runs_with_different_steps_and_overrides_must_be_key_value():
    rows = {("e0", "t"): _row("t", "target", [1], [-1.0])}
    with pytest.raises(RuntimeError, match="different steps"):
        compare(rows, {})
    assert parse_args(["--episodes", "3", "policy.lora_path=x"]).overrides == ["policy.lora_path=x"]
    with pytest.raises(SystemExit):
        parse_args(["--nope"])
