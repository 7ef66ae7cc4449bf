"""MemAgent as a plugin (memrl.methods.memagent): one memory text overwritten per chunk, the answer reading it alone,
every overwrite a memory step credited with the final answer. A scripted policy, real MiniLM + FAISS."""

from __future__ import annotations

import dataclasses
import re

import pytest
from transformers import ByT5Tokenizer

from memrl.config import load_config
from memrl.data.adapters import load_dataset
from memrl.episode.build import build_runner
from memrl.testing.scripted import ScriptedPolicy
from memrl.types import MemoryOpType, StepRole

_TURN = re.compile(r"^\[[^\]]*\] [A-Z][a-z]+: (.*)$", re.M)
_WRITE = re.compile(r"Memory:\n(?P<memory>.*)\nSection:\n(?P<section>.*)\nNew memory:", re.S)


def script(ctx):
    """Overwrites: the old memory plus the section's statements about a person (an empty reply on a section that
    mentions 'weather', to check that it keeps the memory). Answers: the last word of the memory's newest sentence
    naming the person asked about."""
    m = _WRITE.search(ctx.text)
    if m:
        section = m["section"]
        if "weather" in section:
            return ""
        old = [] if m["memory"] == "(empty)" else [m["memory"]]
        new = [
            t for t in _TURN.findall(section) if re.search(r"\b(is|has|lives|called)\b", t) and "?" not in t
        ]
        return " ".join(old + new)
    question = ctx.text.rsplit("?", 1)[0]
    names = re.findall(r"\b([A-Z][a-z]+)\b", question.split("\n")[-1])
    memory = " ".join(re.findall(r"^- \[[^\]]*\] (.*?)$", ctx.text, re.M))
    hits = [s for s in re.split(r"(?<=\.) ", memory) if any(n in s for n in names[1:])]
    return f"<answer>{hits[-1].rstrip('.').split()[-1] if hits else 'unknown'}</answer>"


def _cfg(*extra):
    return load_config(
        None,
        [
            "plugins=[memrl.methods.memagent]",
            "data.options={num_episodes: 3}",
            "tools.enabled=[]",
            "rollout.n=2",
            "rollout.max_response_tokens=48",
            "memory.extractor=memagent",
            "memory.write_max_tokens=2000",
            "memory.write_neighbours=1",
            "memory.top_k=1",
            "memory.neighbour_turns=0",
            "episode.record_history_turns=false",
            "episode.ingest_chunk_turns=6",
            "episode.memory_credit.name=broadcast",
            "episode.memory_credit.format_weight=0.0",
            "episode.memory_credit.op_weight=0.0",  # the dataset's per-turn operations say nothing of an overwrite
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def run():
    cfg = _cfg()
    inputs, _ = load_dataset(cfg.data)
    runner = build_runner(cfg, policy=ScriptedPolicy(ByT5Tokenizer(), script))
    return inputs, runner, runner.run_batch(inputs)


def _writes(traj):
    return [
        (s, r)
        for s, r in zip(traj.steps, traj.step_rewards_ext, strict=True)
        if s.meta.role is StepRole.MEMORY
    ]


def test_the_extractor_name_exists_only_with_the_plugin():
    with pytest.raises(Exception, match="memagent"):
        build_runner(load_config(None, ["memory.extractor=memagent", "tools.enabled=[]"]),
                     policy=ScriptedPolicy(ByT5Tokenizer(), script))  # fmt: skip


def test_each_chunk_overwrites_the_one_memory_fact(run):
    inputs, _, trajs = run
    for traj in (t for t in trajs if t.episode_id.endswith("#0")):
        writes = _writes(traj)
        assert len(writes) == 3  # 18 history turns, 6 per write
        ops = [op for s, _ in writes for op in s.meta.memory_ops]
        assert ops[0].op is MemoryOpType.ADD
        memory_id = ops[0].fact_ids[0]
        for op in ops[1:]:  # in place: the same fact, rewritten
            assert op.op in (MemoryOpType.UPDATE, MemoryOpType.NOOP)
            if op.op is MemoryOpType.UPDATE:
                assert op.fact_ids == (memory_id,)
        # the answer read the memory and nothing else: one fact, the last overwrite's text
        answer = traj.steps[-1]
        assert answer.meta.included_fact_ids == (memory_id,)
        last = [op.text for op in ops if op.op is not MemoryOpType.NOOP][-1]
        inp = next(i for i in inputs if i.episode_id == traj.source_episode_id)
        chunks = [inp.history[i : i + 6] for i in range(0, len(inp.history), 6)]
        kept = [t.text for c in chunks if not any("weather" in t.text for t in c) for t in c]
        stated = [t for t in kept if re.search(r"\b(is|has|lives|called)\b", t) and "?" not in t]
        assert last == " ".join(stated)


def test_the_memory_text_grows_from_its_previous_version(run):
    _, _, trajs = run
    for traj in (t for t in trajs if t.episode_id.endswith("#0")):
        texts = [
            op.text for s, _ in _writes(traj) for op in s.meta.memory_ops if op.op is not MemoryOpType.NOOP
        ]
        for before, after in zip(texts, texts[1:], strict=False):
            assert after.startswith(before)


def test_every_overwrite_gets_the_final_answer_reward(run):
    _, _, trajs = run
    for traj in (t for t in trajs if t.episode_id.endswith("#0")):
        leaves = [t for t in trajs if t.source_episode_id == traj.source_episode_id]
        outcome = sum(t.reward for t in leaves) / len(leaves)
        assert [c for _, c in _writes(traj)] == pytest.approx([outcome] * 3)
        assert all(s.trainable and s.meta.credit_group.endswith("/memory") for s, _ in _writes(traj))
    assert any(t.reward > 0 for t in trajs)  # the scripted answers read some facts right from the memory


def test_an_empty_overwrite_keeps_the_memory_and_counts_as_a_format_error():
    cfg = _cfg("episode.memory_credit.format_weight=1.0")
    inputs, _ = load_dataset(cfg.data)
    first = inputs[0]
    # the second chunk says something about the weather: the script writes nothing for it
    turns = list(first.turns)
    i = turns.index(first.history[7])
    turns[i] = dataclasses.replace(turns[i], text="Nice weather today.")
    inp = dataclasses.replace(first, turns=tuple(turns))
    runner = build_runner(cfg, policy=ScriptedPolicy(ByT5Tokenizer(), script))
    traj = next(t for t in runner.run_batch([inp]) if t.episode_id.endswith("#0"))
    writes = _writes(traj)
    second = writes[1][0]
    assert [op.op for op in second.meta.memory_ops] == [MemoryOpType.NOOP]
    assert second.meta.write.format_errors
    # the format term: the empty write earns the outcome alone, the others one more
    assert writes[0][1] - writes[1][1] == pytest.approx(1.0)
    third_text = writes[2][0].meta.memory_ops[0].text
    assert third_text.startswith(writes[0][0].meta.memory_ops[0].text)


@pytest.mark.parametrize("bad", ["memory.keep_turns=true", "memory.write_neighbours=0"])
def test_the_writer_refuses_settings_that_would_lose_its_one_memory_text(bad):
    with pytest.raises(ValueError, match="keeps one memory text and rewrites it"):
        build_runner(_cfg(bad), policy=ScriptedPolicy(ByT5Tokenizer(), script))
