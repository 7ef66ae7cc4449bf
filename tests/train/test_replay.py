from __future__ import annotations

import logging

import pytest
import torch

import memrl.train.replay as replay_mod
from memrl.data.batch import TrajectoryBatchBuilder
from memrl.data.config import BatchConfig
from memrl.train.config import LoraConfig, ReplayConfig, TrainConfig
from memrl.train.lora import adapter_state, attach_lora
from memrl.train.replay import ReplayBuffer, ReplaySample, replay_loss, sft_rows
from memrl.types import EpisodeStatus, EpisodeTrajectory
from tests.train.train_fixtures import make_episodes, tiny_llama

BUILD = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build


def _buffer(n_groups=3):
    buf = ReplayBuffer(capacity=100, build_batch=BUILD, seed=0)
    buf.add(make_episodes(n_groups=n_groups, n_per_group=4))
    return buf


def test_sample_returns_batch_targets_segments_as_whole_groups():
    buf = _buffer()
    batch, targets, segments = buf.sample(8)
    assert len(segments) == 8 and batch.num_steps == 8
    groups = {e.group_id for e in segments}
    assert all(sum(e.group_id == g for e in segments) == 4 for g in groups)
    assert torch.equal(targets.rewards, torch.tensor([e.reward for e in segments]))


def test_sft_rows_pick_the_best_of_each_group():
    eps = make_episodes(n_groups=2, n_per_group=4)
    batch = BUILD(eps)
    rows = sft_rows(batch, eps, min_reward=0.5)
    for g in ("g0", "g1"):
        idx = [i for i, gid in enumerate(batch.group_ids) if gid == g]
        assert rows[idx].sum() == 1  # exactly one target per group (ties → first)
        best = max(eps[i].reward for i in idx)
        assert eps[idx[int(rows[idx].argmax())]].reward == best


def test_capacity_evicts_oldest_and_skips_failed():
    buf = ReplayBuffer(capacity=5, build_batch=BUILD)
    eps = make_episodes(n_groups=2, n_per_group=4)
    failed = EpisodeTrajectory("bad", "gx", (), 0.0, EpisodeStatus.FAILED, failure_reason="boom")
    buf.add([*eps, failed])
    assert len(buf) == 5
    assert [e.episode_id for e in buf._episodes][0] == eps[3].episode_id


def test_joint_loss_trains_lora_and_missing_segments_warn_once(caplog):
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    cfg = TrainConfig(replay=ReplayConfig(batch_size=8, sft_weight=1.0, rft_weight=0.5))
    sample = _buffer().sample(8)
    before = adapter_state(model)
    for p in model.parameters():
        p.grad = None
    loss, metrics = replay_loss(model, sample, cfg)
    assert metrics["replay/sft_rows"] == 2 and loss.item() != 0
    grads = [p.grad for n, p in model.named_parameters() if p.requires_grad]
    assert any(g is not None and g.abs().sum() > 0 for g in grads)
    assert all(p.grad is None for n, p in model.named_parameters() if not p.requires_grad)

    replay_mod._warned_no_segments = False
    no_seg = ReplaySample(sample.batch, sample.targets, None)
    with caplog.at_level(logging.WARNING, logger="memrl.train.replay"):
        _, m1 = replay_loss(model, no_seg, cfg)
        _, m2 = replay_loss(model, no_seg, cfg)
    assert m1["replay/sft_rows"] == 0 and m2["replay/loss"] != 0  # RFT still trains
    assert sum("SFT skipped" in r.message for r in caplog.records) == 1
    assert all(torch.equal(before[k], v) for k, v in adapter_state(model).items())  # loss only, no step


def test_state_dict_round_trip():
    buf = _buffer()
    state = buf.state_dict()
    other = ReplayBuffer(capacity=100, build_batch=BUILD, seed=5)
    other.load_state_dict(state)
    a, b = buf.sample(4), other.sample(4)
    assert [e.episode_id for e in a.segments] == [e.episode_id for e in b.segments]


def test_empty_buffer_says_so():
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(capacity=3, build_batch=BUILD).sample(2)


def test_rows_of_a_role_not_trained_this_step_get_no_replay_coefficient():
    """A replayed episode's rows count only for the roles trained at this step: answer rows (the target steps of
    these episodes) train when ``answer`` is trained and add nothing, not even a forward, when only ``memory`` is."""
    import dataclasses

    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    cfg = TrainConfig(replay=ReplayConfig(batch_size=8, sft_weight=1.0, rft_weight=0.5))
    sample = _buffer().sample(8)
    for p in model.parameters():
        p.grad = None
    loss, metrics = replay_loss(model, dataclasses.replace(sample, roles=("answer",)), cfg)
    assert metrics["replay/sft_rows"] == 2 and loss.item() != 0
    for p in model.parameters():
        p.grad = None
    loss, metrics = replay_loss(model, dataclasses.replace(sample, roles=("memory",)), cfg)
    assert metrics["replay/sft_rows"] == 0 and loss.item() == 0
    assert all(p.grad is None for p in model.parameters())
