"""The training evaluation's breakdown: per LoCoMo category / question type, and answerable vs adversarial."""

from __future__ import annotations

import pytest

from memrl.train.evaluate import breakdown
from memrl.types import (
    BatchInput,
    EpisodeStatus,
    EpisodeTrajectory,
    StepMeta,
    StepTrajectory,
    TurnRole,
    TurnSpec,
)


def _input(i: int, category: int) -> BatchInput:
    turns = (
        TurnSpec(turn_id=f"q{i}/h", role=TurnRole.HISTORY, text="hi", speaker="A"),
        TurnSpec(turn_id=f"q{i}/t", role=TurnRole.TARGET, text="what?"),
    )
    meta = {"category": category, "adversarial": category == 5}
    return BatchInput(episode_id=f"q{i}", group_id=f"q{i}", turns=turns, final_query="what?", metadata=meta)


def _episode(
    i: int, reward: float, status=EpisodeStatus.COMPLETED, answer: str | None = None
) -> EpisodeTrajectory:
    why = "policy crashed" if status is EpisodeStatus.FAILED else None
    steps = ()
    if answer is not None:
        meta = StepMeta(turn_id=f"q{i}/t", turn_role=TurnRole.TARGET, response_text=answer)
        steps = (StepTrajectory(f"q{i}/s", (1,), (2,), (1,), (-0.1,), f"q{i}/t", TurnRole.TARGET, meta),)
    return EpisodeTrajectory(
        episode_id=f"q{i}", group_id=f"q{i}", steps=steps, reward=reward, status=status, failure_reason=why
    )


def test_locomo_scores_split_by_category_and_answerable_questions():
    inputs = [_input(0, 1), _input(1, 1), _input(2, 2), _input(3, 5)]
    episodes = [_episode(0, 0.5), _episode(1, 1.0), _episode(2, 0.2, EpisodeStatus.FAILED), _episode(3, 1.0)]
    out = breakdown(inputs, episodes)
    assert out["eval/em/multi_hop"] == pytest.approx(0.75) and out["eval/em/temporal"] == 0.0  # failed: 0
    assert sorted(k for k in out if not k.endswith(("_low", "_high"))) == [
        "eval/abstains/answerable", "eval/em/adversarial", "eval/em/answerable", "eval/em/multi_hop", "eval/em/temporal",
        "eval/em/unanswerable",
    ]  # fmt: skip
    assert out["eval/em/answerable"] == pytest.approx(0.5)  # (0.5 + 1.0 + 0 failed) / 3
    assert out["eval/em/unanswerable"] == 1.0
    assert out["eval/em/answerable_ci_low"] <= 0.5 <= out["eval/em/answerable_ci_high"]


def test_abstaining_on_answerable_questions_is_counted():
    inputs = [_input(0, 1), _input(1, 4), _input(2, 2), _input(3, 5)]
    answers = ["<answer>Not mentioned in the conversation</answer>", "<answer>Paris</answer>",
               "I don't know", "<answer>(a)</answer>"]  # fmt: skip
    episodes = [_episode(i, 0.0, answer=a) for i, a in enumerate(answers)]
    assert breakdown(inputs, episodes)["eval/abstains/answerable"] == pytest.approx(2 / 3)


def test_one_group_adds_nothing():
    assert breakdown([_input(0, 1)], [_episode(0, 1.0)]) == {}


def test_lenient_and_f1_score_each_answer_against_its_gold_and_a_failed_episode_zero():
    """Besides the reward (strict EM), the evaluation scores lenient match (gold anywhere in the response) and
    token F1; a failed episode scores 0 in both, whatever its text."""
    from memrl.train.evaluate import side_scores

    inputs = [
        BatchInput(episode_id=f"q{i}", group_id=f"q{i}", turns=_input(i, 1).turns, final_query="what?",
                   target_answer=gold)
        for i, gold in enumerate(["Paris", "blue", "Rome", "Oslo"])
    ]  # fmt: skip
    episodes = [
        _episode(0, 1.0, answer="<answer>Paris</answer>"),  # tagged and right
        _episode(1, 0.0, answer="I think it is blue, as said."),  # untagged: lenient yes, strict no
        _episode(2, 0.0, answer="<answer>Milan</answer>"),  # wrong
        _episode(3, 0.0, EpisodeStatus.FAILED, answer="<answer>Oslo</answer>"),  # failed: 0
    ]
    out = side_scores(inputs, episodes)
    assert out["eval/lenient_match"] == pytest.approx(0.5)
    assert 0.25 < out["eval/token_f1"] < 0.5  # 1 + a partial F1 for the untagged sentence + 0 + 0, over 4
    assert out["eval/lenient_match_ci_low"] <= 0.5 <= out["eval/lenient_match_ci_high"]
    assert set(out) == {
        f"eval/{m}{s}" for m in ("lenient_match", "token_f1") for s in ("", "_ci_low", "_ci_high")
    }
