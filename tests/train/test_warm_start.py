"""Imitation warm start of the memory writer: teacher-forced gold writes (real MiniLM + FAISS) and their SFT."""

from __future__ import annotations

import dataclasses
import random
from types import SimpleNamespace

import pytest
import torch
from transformers import ByT5Tokenizer

from memrl.config import load_config
from memrl.data.adapters import load_dataset
from memrl.episode.build import build_runner
from memrl.memory.writer import WriteRequest
from memrl.testing.scripted import ScriptedPolicy
from memrl.train import warm_start as ws
from memrl.train.config import LoraConfig, WarmStartConfig
from memrl.train.lora import attach_lora
from memrl.train.warm_start import Demonstration, _teacher, gold_writes, op_weights, sft_step
from memrl.types import TurnRole, TurnSpec
from tests.train.train_fixtures import tiny_llama


def _never(ctx):
    raise AssertionError("a teacher-forced write must not generate")


@pytest.fixture(scope="module")
def forced():
    cfg = load_config(
        None,
        [
            "data.options={num_episodes: 6, phrasing: varied}",
            "tools.enabled=[]",
            "memory.extractor=policy",
            "memory.write_neighbours=8",
            "episode.ingest_chunk_turns=6",
        ],
    )
    inputs, _ = load_dataset(cfg.data)
    tok = ByT5Tokenizer()
    runner = build_runner(cfg, policy=ScriptedPolicy(tok, _never))
    return inputs, tok, runner.memory, gold_writes(runner.memory, inputs, 6)


def test_every_chunk_of_every_episode_gets_its_gold_write(forced):
    inputs, tok, memory, demos = forced
    assert len(demos) == sum(-(-len(bi.history) // 6) for bi in inputs) == 6 * 3
    for d in demos:
        assert d.response_ids[-1] == tok.eos_token_id
        reply = tok.decode(list(d.response_ids[:-1]))
        assert reply and all(line.split()[0] in ("ADD", "UPDATE", "NOOP") for line in reply.splitlines())
        assert len(reply.splitlines()) == 6  # one operation per turn of the chunk
    assert not [ns for ns in memory.store.namespaces() if ns.startswith("warm-start/")]  # scratch released


def test_later_writes_read_the_store_the_gold_writes_built(forced):
    """Teacher forcing applies each gold reply: a later write of an episode shows the facts earlier gold ADDs
    wrote, and a gold UPDATE names the shown id of the fact holding the stale value."""
    inputs, tok, _, demos = forced
    first, second = demos[0], demos[len(inputs)]  # episode 0's writes 1 and 2 (writes go batch-wise)
    assert first.episode_id == second.episode_id == inputs[0].episode_id
    added = [ln[4:] for ln in tok.decode(list(first.response_ids[:-1])).splitlines() if ln.startswith("ADD ")]
    assert added and "Memory:\n(empty)" in tok.decode(list(first.prompt_ids))
    assert any(fact in tok.decode(list(second.prompt_ids)) for fact in added)
    updates = [
        (d, ln)
        for d in demos
        for ln in tok.decode(list(d.response_ids[:-1])).splitlines()
        if ln.startswith("UPDATE")
    ]
    assert updates, "varied synthetic episodes restate values: some gold write must be an UPDATE"
    d, line = updates[0]
    local = int(line.split()[1])
    shown = tok.decode(list(d.prompt_ids)).rsplit("Memory:\n", 1)[1].split("\nNew:", 1)[0].splitlines()
    person = line.split()[2]  # gold facts start with the person: "UPDATE 3 Mia lives in Rome."
    assert shown[local].startswith(f"{local}. ") and person in shown[local]


def test_a_turn_without_gold_operations_is_refused_by_name():
    turn = TurnSpec(turn_id="conv-26/s1/t3", role=TurnRole.HISTORY, text="I went hiking.", speaker="Ann")
    with pytest.raises(ValueError, match=r"conv-26/s1/t3.*memory_op.*warm_start.episodes=0"):
        _teacher(WriteRequest((turn,)))


def test_sft_steps_raise_the_likelihood_of_the_gold_replies_and_train_only_the_adapter():
    tiny = tiny_llama()
    with (
        torch.no_grad()
    ):  # a random head of init scale caps every logit near 0: let the adapter reach the tokens
        tiny.lm_head.weight.mul_(30)
    model = attach_lora(tiny, LoraConfig(r=4, alpha=8))
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    gen = torch.Generator().manual_seed(0)
    demos = [
        Demonstration(
            tuple(torch.randint(3, 300, (12,), generator=gen).tolist()),
            tuple(torch.randint(3, 300, (5,), generator=gen).tolist()) + (1,),
            f"e{i}",
        )
        for i in range(4)
    ]
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-2)
    losses = [sft_step(model, opt, demos, micro_batch_size=3, max_grad_norm=1.0) for _ in range(30)]
    assert losses[-1] < 0.1 * losses[0]
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if not p.requires_grad)


def test_warm_start_config_rejects_nonsense():
    with pytest.raises(ValueError, match="episodes must be >= 0"):
        WarmStartConfig(episodes=-1)
    with pytest.raises(ValueError, match="batch_size and epochs"):
        WarmStartConfig(episodes=4, batch_size=0)
    with pytest.raises(ValueError, match="min_recall needs check_episodes"):
        WarmStartConfig(episodes=4, min_recall=0.5)
    with pytest.raises(ValueError, match=r"min_recall in \[0, 1\]"):
        WarmStartConfig(episodes=4, check_episodes=2, min_recall=1.5)


def test_a_balanced_pass_takes_as_many_writes_of_each_decision_as_the_rarest_has():
    demos = [Demonstration((1,), (2,), f"a{i}", "ADD", 0.7) for i in range(9)]
    demos += [Demonstration((1,), (2,), f"u{i}", "UPDATE", 2.0) for i in range(3)]
    demos += [Demonstration((1,), (2,), f"n{i}", "NOOP", 0.9) for i in range(5)]
    demos += [
        Demonstration((1,), (2,), "x", "ADD+NOOP")
    ]  # under the floor: all of its one write, not the count
    got = ws.balanced(demos, random.Random(0), floor=2)
    kinds = [d.decision for d in got]
    assert {k: kinds.count(k) for k in set(kinds)} == {"ADD": 3, "UPDATE": 3, "NOOP": 3, "ADD+NOOP": 1}
    assert len({d.episode_id for d in got}) == len(got) and all(d.weight == 1.0 for d in got)


def test_lowest_recall_reads_only_the_decisions_the_episodes_call_for():
    assert ws.lowest_recall({"recall": {"ADD": 0.9, "UPDATE": 0.0, "DELETE": None, "NOOP": 1.0}}) == 0.0
    assert ws.lowest_recall({"recall": {"ADD": 0.9, "UPDATE": None, "DELETE": None, "NOOP": 0.8}}) == 0.8


def test_a_failed_check_gets_balanced_passes_and_keeps_the_best_checked_weights(monkeypatch):
    """Checks score 0.0, then 0.6, then 0.3: the second pass is undone and the weights after the first kept."""
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    lora = [p for n, p in model.named_parameters() if "lora_" in n]
    checks = iter([0.0, 0.6, 0.3])
    passes: list[int] = []

    def fake_pass(res, demos, rng, desc, progress):  # one pass = every LoRA weight + 1
        with torch.no_grad():
            for p in lora:
                p.add_(1.0)
        passes.append(len(demos))
        return [0.0]

    def fake_check(res, held, progress=False):
        r = next(checks)
        return {"recall": {"ADD": 1.0, "UPDATE": r, "NOOP": 1.0}, "update_recall_right_target": r,
                "end_state": {"correct": r}, "malformed_rate": 0.0}  # fmt: skip

    published = []
    monkeypatch.setattr(ws, "sft_pass", fake_pass)
    monkeypatch.setattr(ws, "check_writer", fake_check)
    monkeypatch.setattr("memrl.train.setup.publish_adapter", lambda res, step: published.append(step))
    start = [p.detach().clone() for p in lora]
    cfg = SimpleNamespace(
        train=SimpleNamespace(warm_start=WarmStartConfig(4, 2, check_episodes=1, min_recall=0.5))
    )
    demos = [Demonstration((1,), (2,), f"e{i}", op) for i, op in enumerate(["ADD"] * 6 + ["UPDATE"] * 2)]
    out = ws.check_and_rebalance(SimpleNamespace(cfg=cfg, model=model), demos, ["held"], random.Random(0))
    assert passes == [4] and published == []  # 0.6 >= 0.5 after one pass (2 writes per decision): kept as is
    assert all(torch.equal(p, s + 1.0) for p, s in zip(lora, start, strict=True))
    assert out["warm_start/balanced_passes"] == 1 and out["warm_start/check_recall_UPDATE"] == 0.6

    checks = iter([0.0, 0.3, 0.2])  # never reaches 0.5: two passes, the first one's weights kept
    passes.clear()
    start = [p.detach().clone() for p in lora]
    out = ws.check_and_rebalance(SimpleNamespace(cfg=cfg, model=model), demos, ["held"], random.Random(0))
    assert len(passes) == ws.BALANCED_PASSES == 2 and published == [0]  # restored, then published
    assert all(torch.equal(p, s + 1.0) for p, s in zip(lora, start, strict=True))
    assert out["warm_start/check_lowest_recall"] == 0.3 and out["warm_start/balanced_passes"] == 2


def test_balanced_writes_weigh_a_rare_decision_more_and_average_one():
    demos = [Demonstration((1,), (2,), f"e{i}", "ADD") for i in range(6)]
    demos += [Demonstration((1,), (2,), f"u{i}", "UPDATE") for i in range(2)]
    weighted = op_weights(demos)
    add, upd = weighted[0].weight, weighted[-1].weight
    assert upd / add == pytest.approx(3**0.5)  # 1/sqrt(count): 6 ADDs against 2 UPDATEs
    assert sum(d.weight for d in weighted) / len(weighted) == pytest.approx(1.0)
    assert [d.episode_id for d in weighted] == [d.episode_id for d in demos]


def test_sft_loss_weighs_each_write_by_its_weight():
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    gen = torch.Generator().manual_seed(1)

    def demo(name, weight=1.0):
        prompt = tuple(torch.randint(3, 300, (10,), generator=gen).tolist())
        return Demonstration(
            prompt, tuple(torch.randint(3, 300, (4,), generator=gen).tolist()), name, "ADD", weight
        )

    a, b = demo("a"), demo("b")
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)  # the model never moves
    alone = sft_step(model, opt, [a], micro_batch_size=4, max_grad_norm=1.0)
    both = sft_step(model, opt, [a, b], micro_batch_size=4, max_grad_norm=1.0)
    weighted = sft_step(
        model, opt, [dataclasses.replace(a, weight=2.0), dataclasses.replace(b, weight=0.0)],
        micro_batch_size=4, max_grad_norm=1.0,
    )  # fmt: skip
    assert weighted == pytest.approx(alone, rel=1e-5)  # (2a + 0b) / 2
    assert both != pytest.approx(alone, rel=1e-3)


def test_token_mean_sft_counts_every_reply_token_once():
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    gen = torch.Generator().manual_seed(2)

    def demo(name, reply_len):
        prompt = tuple(torch.randint(3, 300, (10,), generator=gen).tolist())
        return Demonstration(prompt, tuple(torch.randint(3, 300, (reply_len,), generator=gen).tolist()), name)

    short, long = demo("noop", 2), demo("add", 8)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)  # the model never moves
    step = lambda demos, agg: sft_step(model, opt, demos, 4, 1.0, agg)  # noqa: E731
    l_short, l_long = step([short], "token-mean"), step([long], "token-mean")
    # alone, a write's token mean is its sequence mean
    assert l_short == pytest.approx(step([short], "seq-mean-token-mean"), rel=1e-5)
    # together: each of the 10 reply tokens once, not each write's mean once
    assert step([short, long], "token-mean") == pytest.approx((2 * l_short + 8 * l_long) / 10, rel=1e-4)
    assert step([short, long], "seq-mean-token-mean") == pytest.approx((l_short + l_long) / 2, rel=1e-4)


def test_injected_reply_tokens_are_read_but_never_trained():
    """A demonstration's mask-0 tokens (a tool's injected result) are never trained: with them at the end of the
    reply, its loss is the loss of its written tokens alone."""
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    gen = torch.Generator().manual_seed(3)
    prompt = tuple(torch.randint(3, 300, (10,), generator=gen).tolist())
    call, injected = (tuple(torch.randint(3, 300, (n,), generator=gen).tolist()) for n in (4, 3))
    mask = (1,) * 4 + (0,) * 3
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0)  # the model never moves
    for agg in ("token-mean", "seq-mean-token-mean"):
        masked = sft_step(
            model, opt, [Demonstration(prompt, call + injected, "a", response_mask=mask)], 4, 1.0, agg
        )
        written = sft_step(model, opt, [Demonstration(prompt, call, "a")], 4, 1.0, agg)
        assert masked == pytest.approx(written, rel=1e-5)  # the injected tokens add nothing to the loss
        everything = sft_step(model, opt, [Demonstration(prompt, call + injected, "a")], 4, 1.0, agg)
        assert everything != pytest.approx(masked, rel=1e-3)


def test_warm_start_loss_agg_is_checked():
    with pytest.raises(ValueError, match="loss_agg must be"):
        WarmStartConfig(loss_agg="sum")


def test_the_warm_start_runs_at_its_own_learning_rate_and_gives_the_optimizer_back():
    """train.warm_start.lr: the SFT steps take it; the RL steps after find train.lr again (None: train.lr)."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-4)
    with ws.learning_rate(opt, 1e-3):
        assert [g["lr"] for g in opt.param_groups] == [1e-3]
    assert [g["lr"] for g in opt.param_groups] == [1e-4]
    with ws.learning_rate(opt, None):
        assert [g["lr"] for g in opt.param_groups] == [1e-4]
    with pytest.raises(RuntimeError), ws.learning_rate(opt, 5e-3):
        raise RuntimeError("a failed step")
    assert [g["lr"] for g in opt.param_groups] == [1e-4]
    with pytest.raises(ValueError, match="warm_start.lr must be > 0"):
        WarmStartConfig(episodes=4, lr=0.0)
