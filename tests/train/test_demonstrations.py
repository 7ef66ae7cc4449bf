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
from memrl.train.microbatch import collate, forward_logits, seq_records, token_logprobs
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
        for rec in seq_records(sample.batch, coef, torch.ones(8)):
            mb = collate([rec])  # each row alone
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
    with pytest.raises(
        ValueError, match=r"train\.replay\.demonstrations must be one of 'none', 'gold', 'gold_program'"
    ):
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


def _program_group(prompt_ids, gold="8171", program="print(4821 + 3350)"):
    """One group of two wrong episodes over ``prompt_ids`` whose question has a gold program."""
    from memrl.types import EpisodeStatus, StepMeta, StepTrajectory

    meta = StepMeta(turn_id="Q", gold_answer=gold, gold_python=program, source_episode_id="ep0")
    step = StepTrajectory("ep0/t0", tuple(prompt_ids), (5,), (1,), (-0.5,), "Q", meta=meta)
    return [
        EpisodeTrajectory(f"ep0#{k}", "g0", (step,), reward=0.0, status=EpisodeStatus.COMPLETED)
        for k in range(2)
    ]


def _bpe_tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.mark.parametrize("which", ["bytes", "smollm2"])
def test_program_demonstration_holds_token_for_token_what_a_rollout_of_the_same_text_holds(which, request):
    """The demonstration of a gold program against a real rollout (real sandbox, the rollout engine) whose model
    writes that call and then copies the result into its answer: same ids, same mask (result 0), same result."""
    import shutil

    from memrl.rollout import RolloutRequest, run_rollout
    from memrl.rollout.config import RolloutConfig
    from memrl.testing.scripted import ScriptedPolicy
    from memrl.tools import ToolExecutor, ToolsConfig
    from memrl.train.demonstrations import ProgramRunner

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    tok = byte_tokenizer() if which == "bytes" else _bpe_tokenizer(request.getfixturevalue("smollm2_dir"))
    program, gold = "print(4821 + 3350)", "8171"

    def script(ctx):
        if "<result>" not in ctx.text:
            return f"<python>{program}</python>"
        return f"<answer>{ctx.text.rsplit('<result>', 1)[1].split('</result>')[0]}</answer>"

    prompt = tok("Question: savings?\n", add_special_tokens=False)["input_ids"]
    tools_cfg = ToolsConfig(enabled=["python"])
    with ToolExecutor(tools_cfg) as tools:
        result = run_rollout(
            [RolloutRequest(tuple(prompt), "ep0")],
            ScriptedPolicy(tok, script),
            tools,
            RolloutConfig(n=1, temperature=0.0, max_response_tokens=200),
        )
    leaf = result.leaves[0][0]
    runner = ProgramRunner(tools_cfg)
    try:
        demo = GoldDemonstrations(tok, min_reward=1.0, run_program=runner)(
            _program_group(prompt, gold, program)
        )
    finally:
        runner.close()
    step = demo.steps[0]
    assert (
        tok.decode(list(leaf.response_ids))
        == f"<python>{program}</python> <result>{gold}</result><answer>{gold}</answer>"
    )
    # The rollout stops at </answer>; every demonstration ends its turn with eos after it.
    assert step.response_ids[:-1] == leaf.response_ids and step.response_ids[-1] == tok.eos_token_id
    assert step.response_mask[:-1] == leaf.response_mask and step.response_mask[-1] == 1
    assert 0 in step.response_mask and set(step.response_mask) == {0, 1}
    assert step.prompt_ids == leaf.prompt_ids
    injected = [t for t, m in zip(step.response_ids, step.response_mask, strict=True) if m == 0]
    assert tok.decode(injected) == f" <result>{gold}</result>"
    [call] = step.meta.tool_calls
    assert (call.name, call.arguments, call.result, call.status) == ("python", program, gold, "ok")
    assert leaf.meta.tool_calls[0].result == call.result
    # Model tokens carry no behaviour log-prob; the injected ones the rollout's 0.0.
    assert all(math.isnan(lp) == bool(m) for lp, m in zip(step.logprobs, step.response_mask, strict=True))


def test_program_demonstrations_fall_back_to_the_answer_and_refuse_a_program_that_misses_the_gold():
    from memrl.tools import ToolResult
    from memrl.types import ToolStatus

    tok = byte_tokenizer()
    runs = []

    def run(program):
        runs.append(program)
        return ToolResult(text=str(eval(program.removeprefix("print"))), status=ToolStatus.OK)  # noqa: S307

    demonstrate = GoldDemonstrations(tok, min_reward=1.0, run_program=run)
    # No program: the gold answer alone.
    plain = demonstrate(_group(_episodes()))
    assert plain.steps[0].response_mask == (1,) * len(plain.steps[0].response_ids)
    assert not plain.steps[0].meta.tool_calls and not runs
    demo = demonstrate(_program_group((7, 8, 9), gold="12", program="print(5 + 7)"))
    assert runs == ["print(5 + 7)"] and demo.steps[0].meta.response_text == (
        "<python>print(5 + 7)</python> <result>12</result><answer>12</answer>"
    )
    with pytest.raises(
        ValueError, match=r"gold program 'print\(5 \+ 6\)' gave ok result '11', not the gold answer '12'"
    ):
        demonstrate(_program_group((7, 8, 9), gold="12", program="print(5 + 6)"))
    # Without a runner (demonstrations: gold) a question with a program still gets the answer alone.
    answer_only = GoldDemonstrations(tok, min_reward=1.0)(_program_group((7, 8, 9), gold="12"))
    assert not answer_only.steps[0].meta.tool_calls


def test_gold_program_demonstrations_need_the_python_tool(tmp_path):
    from memrl.config import load_config
    from memrl.train.setup import build_resources

    cfg = load_config(
        None,
        ["train.replay.demonstrations=gold_program", "train.replay.batch_size=4", "tools.enabled=[search]",
         "policy.model=random-tiny", f"output_dir={tmp_path}"],
    )  # fmt: skip
    with pytest.raises(
        ValueError, match=r"demonstrations=gold_program demonstrates python calls.*\['search'\]"
    ):
        build_resources(cfg)
