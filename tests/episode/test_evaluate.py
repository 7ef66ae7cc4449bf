"""memrl eval scoring: per-group means over leaf 0, failed episodes score 0, history-token accounting."""

from __future__ import annotations

import pytest
from transformers import ByT5Tokenizer

from memrl.episode.evaluate import full_history_tokens, group_key, score_ablation
from memrl.rewards import make_reward
from memrl.types import BatchInput, EpisodeStatus, EpisodeTrajectory, StepMeta, StepTrajectory, TurnSpec


def _bi(eid: str, answer: str, **meta) -> BatchInput:
    turns = (
        TurnSpec("history", "Ann lives in Oslo", "D1:1", "Ann", "2023-01-01"),
        TurnSpec("target", "Where?", "Q"),
    )
    return BatchInput(eid, eid, turns, "Where?", answer, meta)


def _traj(eid: str, response: str, leaf: int = 0, failed: bool = False) -> EpisodeTrajectory:
    if failed:
        return EpisodeTrajectory(eid, eid, (), 0.0, EpisodeStatus.FAILED, failure_reason="x")
    meta = StepMeta(extra={"source_episode_id": eid, "response_text": response})
    step = StepTrajectory(f"{eid}/t{leaf}", (1, 2, 3), (4,), (1,), (0.0,), "Q", meta=meta)
    return EpisodeTrajectory(f"{eid}#{leaf}", eid, (step,), 0.0, EpisodeStatus.COMPLETED)


def test_group_key_prefers_locomo_category_then_question_type():
    assert group_key({"category": 1}) == "multi_hop"
    assert group_key({"category": "5"}) == "adversarial"
    assert group_key({"question_type": "temporal-reasoning"}) == "temporal-reasoning"
    assert group_key({}) == "all"


def test_score_ablation_uses_leaf_zero_and_zero_for_failures():
    inputs = [
        _bi("a", "Oslo", question_type="lookup"),
        _bi("b", "Rome", question_type="lookup"),
        _bi("c", "Bergen", question_type="update"),
    ]
    trajs = [
        _traj("a", "<answer>Oslo</answer>", 0),
        _traj("a", "<answer>wrong</answer>", 1),  # leaf 1 is ignored
        _traj("b", "<answer>Paris</answer>"),
        _traj("c", "", failed=True),
    ]
    out = score_ablation(inputs, trajs, {"exact_match": make_reward("exact_match")})
    assert out["exact_match"] == pytest.approx(1 / 3)
    assert out["exact_match_by_group"] == {"lookup": 0.5, "update": 0.0}
    assert out["failed"] == 1 and out["group_sizes"] == {"lookup": 2, "update": 1}
    assert out["prompt_tokens_mean"] == pytest.approx(2.0)  # 3 + 3 + 0 (failed) over 3


def test_full_history_tokens_counts_the_raw_history():
    tok = ByT5Tokenizer()
    short, long = _bi("a", "x"), _bi("b", "x")
    long = BatchInput("b", "b", (*long.history * 3, long.target), "Where?", "x")
    assert full_history_tokens(tok, long) > full_history_tokens(tok, short) > len("Ann lives in Oslo")
