"""How the per-step terms of memory credit combine (memrl.episode.credit.step_rewards)."""

from __future__ import annotations

import pytest

from memrl.episode.config import MemoryCreditConfig
from memrl.episode.credit import (
    STEP_CREDITS,
    CreditInput,
    CreditSpec,
    SampleAt,
    ScoredBy,
    credit_group,
    get_credit,
    step_rewards,
)
from memrl.types import MemoryWrite, StepMeta, StepRole, StepTrajectory, TurnRole


def _write(sid, **write):
    meta = StepMeta(
        turn_id=sid,
        turn_role=TurnRole.HISTORY,
        role=StepRole.MEMORY,
        write=MemoryWrite(**{"index": 0, **write}),
    )
    return StepTrajectory(sid, (1, 2), (3, 4), (1, 1), (-0.1, -0.2), sid, TurnRole.HISTORY, meta)


def test_op_term_pays_the_share_of_gold_operations_right():
    steps = (
        _write("w0", op_score=1.0),
        _write("w1", op_score=0.8),  # most lines right: most of the term
        _write("w2", op_score=0.0, format_errors=["line 2: unknown id 9"]),
        _write("w3", op_score=1.0),
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
        _write("w0", op_score=1.0, alternatives=2),
        _write("w0.1", alternative=1, applied=False, op_score=0.0, alternatives=2),  # scored, not applied
    )
    cfg = MemoryCreditConfig(name="local", format_weight=0.2, op_weight=0.5)
    got = step_rewards(CreditInput(steps, outcome=0.9, used_fact_ids=frozenset()), cfg)
    assert got == pytest.approx([0.2 + 0.5, 0.2])  # the outcome is not a reply's own: left out
    with pytest.raises(ValueError, match="every write would score 0"):
        MemoryCreditConfig(name="local", format_weight=0.0, op_weight=0.0)


def test_unsupported_term_charges_a_write_that_invents_a_fact():
    steps = (
        _write("w0", alternatives=2, facts_written=1, unsupported_facts=["Diego is a musician."]),
        _write("w0.1", alternative=1, alternatives=2, applied=False, facts_written=0),  # the NOOP reply
        _write("w1", facts_written=1),  # "Priya lives in Porto." from "I live in Porto now!"
    )
    cfg = MemoryCreditConfig(name="local", format_weight=0.2, op_weight=0.0, unsupported_weight=0.5)
    got = step_rewards(CreditInput(steps, outcome=0.0, used_fact_ids=frozenset()), cfg)
    assert got == pytest.approx([0.2 - 0.5, 0.2, 0.2])
    # The term alone is a valid local credit; as a penalty it cannot be negative.
    assert MemoryCreditConfig(name="local", format_weight=0.0, op_weight=0.0, unsupported_weight=1.0)
    with pytest.raises(ValueError, match="unsupported_weight is a penalty"):
        MemoryCreditConfig(unsupported_weight=-0.1)


def test_snapshot_score_must_be_one_the_scorer_knows():
    assert MemoryCreditConfig(snapshot_score="gold_logprob").snapshot_score == "gold_logprob"
    with pytest.raises(ValueError, match=r"snapshot_score must be one of \['answer', 'gold_logprob'\]"):
        MemoryCreditConfig(snapshot_score="f1")


def test_each_credit_declares_what_the_runner_samples_and_how_it_is_scored():
    specs = {name: get_credit(name).spec for name in STEP_CREDITS.names()}
    assert specs == {
        "broadcast": CreditSpec(),
        "used": CreditSpec(),
        "snapshot": CreditSpec(SampleAt.PLANNED, ScoredBy.ANSWERING),
        "local": CreditSpec(SampleAt.EVERY_WRITE, ScoredBy.STEP_TERMS),
    }
    assert [n for n, s in specs.items() if s.samples_alternatives] == ["local", "snapshot"]
    with pytest.raises(ValueError, match="scored_by=answering scores sampled alternatives"):
        CreditSpec(scored_by=ScoredBy.ANSWERING)
    with pytest.raises(KeyError, match="valid choices: broadcast, local, snapshot, used"):
        get_credit("outcome")


def test_a_dotted_credit_must_be_a_step_credit():
    with pytest.raises(TypeError, match="expected a StepCredit"):
        get_credit("memrl.episode.credit:used")  # the bare function, not its registry entry


def test_credit_group_of_a_sampled_write_is_its_own():
    assert credit_group("g", MemoryWrite(index=2, alternatives=3)) == "g/memory/2"
    assert credit_group("g", MemoryWrite(index=2)) == "g/memory"
