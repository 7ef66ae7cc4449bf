from __future__ import annotations

from types import SimpleNamespace

from memrl.bench.rollout import _rollback_workload


def test_rollback_keeps_context_shorter_than_keeping_failures():
    out = _rollback_workload(SimpleNamespace(calls=2))
    # Every call is first written wrong and repaired after one rollback: 4 prompts x 4 leaves x 2 calls.
    assert out["rollbacks"] == out["rollback_repairs"] == 32
    assert 0 < out["rollback_response_ratio"] < out["rollback_context_ratio"] < 1
    assert out["rollback_context_tokens"] < out["kept_failures_context_tokens"]
