"""How the per-step terms of memory credit combine (memrl.episode.credit.step_rewards)."""

from __future__ import annotations

import pytest

from memrl.episode.config import MemoryCreditConfig
from memrl.episode.credit import CreditInput, step_rewards
from memrl.types import StepMeta, StepTrajectory, TurnRole


def _write(sid, **extra):
    meta = StepMeta(
        turn_id=sid, turn_role=TurnRole.HISTORY, extra={"role": "memory", "applied": True, **extra}
    )
    return StepTrajectory(sid, (1, 2), (3, 4), (1, 1), (-0.1, -0.2), sid, TurnRole.HISTORY, meta)


def test_op_term_pays_the_share_of_gold_operations_right():
    steps = (
        _write("w0", op_score=1.0, op_right=True),
        _write("w1", op_score=0.8, op_right=False),  # most lines right: most of the term
        _write("w2", op_score=0.0, op_right=False, format_errors=["line 2: unknown id 9"]),
        _write("w3", op_right=True),  # a step without op_score (older dumps) falls back to op_right
        _write("w4"),  # the dataset does not know this write's operations: no op term
        _write("w5", applied=False, op_score=1.0),  # an alternative that was not applied trains nothing
    )
    cfg = MemoryCreditConfig(name="broadcast", format_weight=0.2, op_weight=0.5)
    got = step_rewards(CreditInput(steps, outcome=0.5, used_fact_ids=frozenset()), cfg)
    assert got == pytest.approx([0.5 + 0.2 + 0.5, 0.5 + 0.2 + 0.4, 0.5, 0.5 + 0.2 + 0.5, 0.5 + 0.2, None])
    outcome_only = MemoryCreditConfig(name="broadcast", format_weight=0.0, op_weight=0.0)
    got = step_rewards(CreditInput(steps, outcome=0.5, used_fact_ids=frozenset()), outcome_only)
    assert got == [0.5] * 5 + [None]


def test_local_credit_scores_every_reply_by_its_step_terms_alone():
    steps = (
        _write("w0", op_score=1.0, alternatives=2, write_index=0),
        _write("w0.1", applied=False, op_score=0.0, alternatives=2, write_index=0),  # scored, not applied
    )
    cfg = MemoryCreditConfig(name="local", format_weight=0.2, op_weight=0.5)
    got = step_rewards(CreditInput(steps, outcome=0.9, used_fact_ids=frozenset()), cfg)
    assert got == pytest.approx([0.2 + 0.5, 0.2])  # the outcome is not a reply's own: left out
    with pytest.raises(ValueError, match="every write would score 0"):
        MemoryCreditConfig(name="local", format_weight=0.0, op_weight=0.0)


def test_snapshot_score_must_be_one_the_scorer_knows():
    assert MemoryCreditConfig(snapshot_score="gold_logprob").snapshot_score == "gold_logprob"
    with pytest.raises(ValueError, match=r"snapshot_score must be one of \['answer', 'gold_logprob'\]"):
        MemoryCreditConfig(snapshot_score="f1")
