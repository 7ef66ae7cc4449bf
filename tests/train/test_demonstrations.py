"""Gold demonstrations for the replay SFT term: built from the target prompt and the gold answer, trained by SFT
only, rebuilt after a state_dict round trip; ``demonstrations: none`` leaves replay as it was."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from memrl.data.batch import TrajectoryBatchBuilder
from memrl.data.config import BatchConfig
from memrl.serialize import episode_from_dict, to_dict
from memrl.testing.models import byte_tokenizer
from memrl.train.config import LoraConfig, ReplayConfig, TrainConfig
from memrl.train.demonstrations import GoldDemonstrations
from memrl.train.lora import attach_lora, trainable_parameters
from memrl.train.microbatch import collate, forward_logits, token_logprobs, unpack
from memrl.train.replay import ReplayBuffer, replay_loss
from memrl.types import EpisodeTrajectory
from tests.train.train_fixtures import make_episodes, tiny_llama

BUILD = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build
GOLD = "Oslo"


def _episodes(rewards=(0.0, 0.5, 0.25, 0.0), gold: str | None = GOLD, n_groups: int = 2) -> list:
    """Groups sharing one prompt each, with the given rewards and the gold answer on every target step."""
    eps = make_episodes(n_groups=n_groups, n_per_group=len(rewards), shared_prompt=True)
    out = []
    for i, ep in enumerate(eps):
        step = ep.steps[-1]
        step = dataclasses.replace(step, meta=dataclasses.replace(step.meta, gold_answer=gold))
        out.append(dataclasses.replace(ep, steps=(step,), reward=rewards[i % len(rewards)]))
    return out


def _group(eps, gid="g0") -> list[EpisodeTrajectory]:
    return [e for e in eps if e.group_id == gid]


def test_demonstration_is_the_target_prompt_then_the_tagged_gold_answer_and_eos():
    tok = byte_tokenizer()
    group = _group(_episodes())
    demo = GoldDemonstrations(tok, min_reward=1.0)(group)
    assert demo is not None and demo.group_id == "g0" and len(demo.steps) == 1
    step = demo.steps[0]
    best = group[1]  # reward 0.5: the group's best episode
    assert step.prompt_ids == best.steps[-1].prompt_ids
    answer = tok("<answer>Oslo</answer>", add_special_tokens=False)["input_ids"]
    assert step.response_ids == (*answer, tok.eos_token_id)
    assert step.response_mask == (1,) * len(step.response_ids) and step.trainable
    assert all(math.isnan(lp) for lp in step.logprobs)  # nothing sampled it: no behaviour log-prob
    assert step.meta.gold_answer == GOLD and demo.reward == 0.0
    assert demo.episode_id not in {e.episode_id for e in group}


def test_no_demonstration_for_a_strictly_right_group_or_without_gold():
    tok = byte_tokenizer()
    demonstrate = GoldDemonstrations(tok, min_reward=1.0)
    # a strictly right episode is its own SFT target
    assert demonstrate(_group(_episodes(rewards=(0.0, 1.0, 0.5, 0.0)))) is None
    assert demonstrate(_group(_episodes(gold=None))) is None


def test_tokenizer_without_eos_is_refused():
    tok = byte_tokenizer()
    tok.eos_token = None
    with pytest.raises(ValueError, match="eos"):
        GoldDemonstrations(tok, min_reward=1.0)


def test_sample_places_each_demonstration_after_its_group_and_sft_trains_only_those_rows():
    buf = ReplayBuffer(100, BUILD, seed=0, demonstrate=GoldDemonstrations(byte_tokenizer(), 1.0))
    buf.add(_episodes())
    sample = buf.sample(8)
    assert len(sample.segments) == 8 and len(sample.demonstrations) == 2 and sample.batch.num_steps == 10
    ids = sample.batch.episode_ids
    # right after its group: a shared-prefix micro-batch forwards the prompt once for both
    for demo in sample.demonstrations:
        k = ids.index(demo.episode_id)
        assert sample.batch.group_ids[k - 1] == demo.group_id
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    sft = TrainConfig(replay=ReplayConfig(batch_size=8, sft_weight=1.0, min_reward=1.0))
    _, m = replay_loss(model, sample, sft)
    assert m["replay/sft_rows"] == 2 and m["replay/demo_rows"] == 2 and m["replay/demo_token_logp"] < 0
    # RFT never trains on a demonstration (it has no reward of its own)
    rft = TrainConfig(replay=ReplayConfig(batch_size=8, sft_weight=0.0, rft_weight=1.0, min_reward=1.0))
    _, m = replay_loss(model, sample, rft)
    assert "replay/demo_token_logp" not in m and m["replay/loss"] != 0


def _answer_logp(model, demo: EpisodeTrajectory) -> float:
    step = demo.steps[0]
    ids = torch.tensor([[*step.prompt_ids, *step.response_ids]])
    with torch.no_grad():
        logp = token_logprobs(model(input_ids=ids).logits.float(), ids)
    return float(logp[0, len(step.prompt_ids) :].mean())


def test_sft_on_demonstrations_raises_the_answer_logprob():
    """Real PEFT LoRA, real forward/backward: a few SFT steps make ``<answer>gold</answer><eos>`` more likely."""
    torch.manual_seed(0)
    model = attach_lora(tiny_llama(), LoraConfig(r=8, alpha=16))
    cfg = TrainConfig(
        replay=ReplayConfig(batch_size=8, sft_weight=1.0, min_reward=1.0, demonstrations="gold"),
    )
    buf = ReplayBuffer(100, BUILD, seed=0, demonstrate=GoldDemonstrations(byte_tokenizer(), 1.0))
    buf.add(_episodes())
    opt = torch.optim.AdamW(trainable_parameters(model), lr=1e-2)
    demos = buf.sample(8).demonstrations
    before = [_answer_logp(model, d) for d in demos]
    seen = []
    model.train()
    for _ in range(5):
        _, metrics = replay_loss(model, buf.sample(8), cfg)
        seen.append(metrics["replay/demo_token_logp"])
        opt.step()
        opt.zero_grad(set_to_none=True)
    model.eval()
    after = [_answer_logp(model, d) for d in demos]
    assert all(a > b + 0.2 for a, b in zip(after, before, strict=True)), (before, after)
    assert seen[-1] > seen[0]


def test_none_keeps_replay_as_it_was():
    """Without demonstrations: no extra rows, and the loss (which skips the forward of coefficient-0 rows)
    equals the full computation over every row."""
    eps = _episodes()
    buf = ReplayBuffer(100, BUILD, seed=0)
    buf.add(eps)
    sample = buf.sample(8)
    assert sample.demonstrations == [] and sample.batch.num_steps == len(sample.segments) == 8
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    cfg = TrainConfig(replay=ReplayConfig(batch_size=8, sft_weight=1.0, rft_weight=0.5, min_reward=0.5))
    loss, metrics = replay_loss(model, sample, cfg)
    assert metrics["replay/demo_rows"] == 0 and "replay/demo_token_logp" not in metrics
    # the reference: every row forwarded, coefficient sft·is_best + rft·reward, mean per row over all rows
    rewards = sample.targets.rewards
    is_best = torch.tensor([1.0 if r == 0.5 else 0.0 for r in rewards])  # one 0.5 per group is its best
    coef = 1.0 * is_best + 0.5 * rewards
    ref = 0.0
    with torch.no_grad():
        for mb in (collate([rec]) for rec in unpack(sample.batch, coef, torch.ones(8))):  # each row alone
            logp = token_logprobs(forward_logits(model, mb), mb.input_ids)
            ref += float((-mb.adv * logp * mb.loss_mask).sum() / mb.loss_mask.sum())
    assert loss.item() == pytest.approx(ref / 8, rel=1e-5)


def test_state_dict_round_trip_rebuilds_the_same_demonstrations():
    tok = byte_tokenizer()
    buf = ReplayBuffer(100, BUILD, seed=0, demonstrate=GoldDemonstrations(tok, 1.0))
    buf.add(_episodes())
    state = json.loads(json.dumps(buf.state_dict()))  # as the checkpoint's state.json stores it
    other = ReplayBuffer(100, BUILD, seed=0, demonstrate=GoldDemonstrations(tok, 1.0))
    other.load_state_dict(state)
    a, b = buf.sample(8), other.sample(8)
    key = lambda d: (d.episode_id, d.steps[0].prompt_ids, d.steps[0].response_ids, d.steps[0].response_mask)  # noqa: E731
    assert [key(d) for d in a.demonstrations] == [key(d) for d in b.demonstrations] and a.demonstrations
    assert a.batch.episode_ids == b.batch.episode_ids
    # a demonstration is an ordinary contract: it survives to_dict / JSON / episode_from_dict
    demo = a.demonstrations[0]
    back = episode_from_dict(json.loads(json.dumps(to_dict(demo))))
    assert key(back) == key(demo) and back.steps[0].meta.gold_answer == GOLD


@pytest.mark.parametrize("value", ["expert", "Gold", ""])
def test_bad_demonstrations_value_lists_the_choices(value):
    with pytest.raises(ValueError, match=r"train\.replay\.demonstrations must be one of 'none', 'gold'"):
        ReplayConfig(demonstrations=value)


def _with_write(ep: EpisodeTrajectory, op_right: bool | None) -> EpisodeTrajectory:
    """``ep`` with one applied memory write before its target step (its ops right, wrong or unknown)."""
    from memrl.types import MemoryWrite, StepMeta, StepRole, StepTrajectory, TurnRole

    record = MemoryWrite(
        index=0,
        op_score=None if op_right is None else float(op_right),
        gold_ops=None if op_right is None else "ADD Ann lives in Oslo.\nNOOP",
    )
    meta = StepMeta(
        turn_id="D1:2", turn_role=TurnRole.HISTORY, role=StepRole.MEMORY, write=record,
        credit_group=f"{ep.group_id}/memory",
    )  # fmt: skip
    write = StepTrajectory(
        f"{ep.episode_id}/w0", (5, 6, 7), (8, 9), (1, 1), (-0.3, -0.4), "D1:2", TurnRole.HISTORY, meta
    )
    return dataclasses.replace(ep, steps=(write, *ep.steps), step_rewards_ext=(0.5, None))


def test_memory_demonstrations_imitate_the_gold_operations_of_wrong_writes():
    tok = byte_tokenizer()
    group = [_with_write(e, op_right=False) for e in _group(_episodes(rewards=(1.0, 0.0, 0.0, 0.0)))]
    demo = GoldDemonstrations(tok, min_reward=1.0, memory=True)(group)
    # The group reached min_reward (no answer demonstration), but its writes got their operations wrong.
    assert demo is not None and all(s.meta.role == "memory" for s in demo.steps)
    assert all(s.meta.write.op_right and not s.meta.write.format_errors for s in demo.steps)
    step = demo.steps[0]
    gold_ids = tok("ADD Ann lives in Oslo.\nNOOP", add_special_tokens=False)["input_ids"]
    assert step.prompt_ids == (5, 6, 7) and list(step.response_ids) == [*gold_ids, tok.eos_token_id]
    assert step.response_mask == (1,) * len(step.response_ids) and all(math.isnan(x) for x in step.logprobs)
    batch = BUILD([demo])  # a trainable row of its own (SFT reads it; no policy-gradient ratio)
    assert batch.step_ids == [s.step_id for s in demo.steps] and len(demo.steps) == len(group)
    assert set(batch.group_ids) == {f"{group[0].group_id}/memory/gold"}
    # Right or unknown operations need no demonstration; nor does anything with memory demonstrations off.
    assert GoldDemonstrations(tok, min_reward=1.0, memory=True)([_with_write(e, True) for e in _group(
        _episodes(rewards=(1.0, 0.0, 0.0, 0.0)))]) is None  # fmt: skip
    assert GoldDemonstrations(tok, min_reward=1.0, memory=False)(group) is None
