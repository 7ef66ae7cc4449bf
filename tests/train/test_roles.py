"""Which role's rows train: joint, alternating phases, and the per-role metrics."""

from __future__ import annotations

import torch

from memrl.train.config import TrainConfig
from memrl.train.roles import active_roles, keep_roles, memory_rollout_metrics, role_metrics
from memrl.types import EpisodeTrajectory, MemoryWrite, StepMeta, StepRole, StepTrajectory, TurnRole


def _step(sid, role, memory=False, **write):
    meta = StepMeta(
        turn_id=sid,
        turn_role=role,
        role=StepRole.MEMORY if memory else None,
        write=MemoryWrite(index=0, **write) if memory else None,
    )
    return StepTrajectory(sid, (1, 2), (3, 4), (1, 1), (-0.1, -0.2), sid, role, meta)


def _episode():
    steps = (
        _step("w0", TurnRole.HISTORY, memory=True, applied=True, op_score=1.0),
        _step("w1", TurnRole.HISTORY, memory=True, applied=True, op_score=0.0, format_errors=("bad",)),
        _step("t0", TurnRole.TARGET),
    )
    return EpisodeTrajectory("e", "g", steps, 1.0, "completed", step_rewards_ext=(0.7, 0.0, None))


def test_alternate_schedule_trains_one_role_per_phase():
    cfg = TrainConfig(role_schedule="alternate", role_phase_steps=2, roles=["memory", "answer"])
    assert [active_roles(cfg, s) for s in range(1, 6)] == [
        ["memory"],
        ["memory"],
        ["answer"],
        ["answer"],
        ["memory"],
    ]
    assert active_roles(TrainConfig(), 3) == ["answer", "memory"]


def test_keep_roles_drops_the_frozen_role_rows_and_their_credit():
    (ep,) = keep_roles([_episode()], ["answer"])
    assert [s.step_id for s in ep.steps] == ["t0"] and ep.step_rewards_ext == (None,)
    (ep,) = keep_roles([_episode()], ["memory"])
    assert [s.step_id for s in ep.steps] == ["w0", "w1"] and ep.step_rewards_ext == (0.7, 0.0)


def test_role_metrics_split_memory_and_answer_rows():
    steps = _episode().steps
    got = role_metrics([s.meta for s in steps], torch.tensor([0.7, 0.0, 1.0]), torch.tensor([1.0, -1.0, 0.5]),
                       torch.ones(3))  # fmt: skip
    assert got["memory/rows"] == 2 and got["memory/reward_mean"] == torch.tensor(0.35).item()
    assert got["answer/adv_mean"] == 0.5 and got["memory/adv_abs_mean"] == 1.0


def test_memory_rollout_metrics():
    got = memory_rollout_metrics([_episode()])
    assert got == {
        "memory/steps": 2.0,
        "memory/format_ok": 0.5,
        "memory/credit_mean": 0.35,
        "memory/op_right": 0.5,
        "memory/op_score": 0.5,
    }
