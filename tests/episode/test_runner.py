"""EpisodeRunner state machine with a scripted policy (deterministic), real MiniLM + FAISS memory."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from transformers import ByT5Tokenizer

from memrl.config import load_config
from memrl.data.adapters import load_dataset
from memrl.episode.build import build_runner
from memrl.policy.errors import PolicyError
from memrl.testing.scripted import ScriptedPolicy
from memrl.types import EpisodeStatus, MemoryOpType, TurnRole


def _answer_from_memory(ctx):
    """Answers with the last word of the newest fact line that names the asked-about person."""
    question = ctx.text.rsplit("<|user|>", 1)[-1]
    names = re.findall(r"\b([A-Z][a-z]+)\b", question.split("?")[0])
    facts = re.findall(r"^- \[[^\]]*\] (.*?)(?: \([^)]*\))?$", ctx.text, re.M)
    hits = [f for f in facts if any(n in f for n in names[1:])]
    return f"<answer>{hits[-1].rstrip('.').split()[-1] if hits else 'unknown'}</answer>"


@pytest.fixture(scope="module")
def setup():
    cfg = load_config(
        None,
        [
            "data.options={num_episodes: 6}",
            "tools.enabled=[]",
            "rollout.n=1",
            "rollout.max_response_tokens=64",
            "memory.top_k=4",
            "memory.neighbour_turns=0",  # one fact per turn: the scripted model reads single facts
        ],
    )
    inputs, _ = load_dataset(cfg.data)
    return cfg, inputs, ScriptedPolicy(ByT5Tokenizer(), _answer_from_memory)


def test_memory_helps_and_no_memory_ablation_builds_none(setup):
    cfg, inputs, policy = setup
    lookups = [bi for bi in inputs if bi.metadata["question_type"] != "arithmetic"]
    with_mem = build_runner(cfg, policy=policy).run_batch(lookups)
    no_cfg = dataclasses.replace(cfg, episode=dataclasses.replace(cfg.episode, context="none"))
    without = build_runner(no_cfg, policy=policy).run_batch(lookups)
    assert sum(t.reward for t in with_mem) >= 1 and sum(t.reward for t in without) == 0
    for traj in without:
        target = traj.steps[-1]
        assert "Memory:" not in policy.tokenizer.decode(list(target.prompt_ids))
        assert not target.meta.memory_ops and not target.meta.retrieved_ids
        assert all(not s.meta.memory_ops for s in traj.steps if s.turn_role is TurnRole.HISTORY)
    assert any(op.op is MemoryOpType.RETRIEVE for t in with_mem for op in t.steps[-1].meta.memory_ops)


def test_duplicate_ids_and_reward_errors_fail_only_their_episode(setup):
    cfg, inputs, policy = setup
    locomo_cfg = dataclasses.replace(cfg, episode=dataclasses.replace(cfg.episode, reward="locomo"))
    a = dataclasses.replace(inputs[0], metadata={**inputs[0].metadata, "category": 4})
    b = inputs[1]  # no LoCoMo category: the locomo reward cannot score it
    trajs = build_runner(locomo_cfg, policy=policy).run_batch([a, b, a])
    assert [t.status for t in trajs] == [EpisodeStatus.COMPLETED, EpisodeStatus.FAILED, EpisodeStatus.FAILED]
    assert trajs[1].failure_reason.startswith("scoring:") and "category" in trajs[1].failure_reason
    assert "duplicate episode_id" in trajs[2].failure_reason


def test_infrastructure_errors_are_raised_not_blamed_on_an_episode(setup):
    cfg, inputs, _ = setup

    def broken(ctx):
        raise PolicyError("backend is gone")

    runner = build_runner(cfg, policy=ScriptedPolicy(ByT5Tokenizer(), broken))
    with pytest.raises(PolicyError, match="backend is gone"):
        runner.run_batch(inputs[:2])
    assert runner.memory.store.namespaces() == []  # memory released even though the batch raised


def test_copies_of_one_prompt_all_run_as_one_group(setup):
    """n_samples_per_prompt > 1: every copy runs (none is failed as a duplicate) and the copies form one group."""
    from memrl.data.datasource import RolloutDataSource

    cfg, inputs, policy = setup
    groups = RolloutDataSource(inputs[:2], n_samples_per_prompt=4, shuffle=False).get_samples(2)
    trajs = build_runner(cfg, policy=policy).run_batch([x for g in groups for x in g])
    assert [t.status for t in trajs].count(EpisodeStatus.FAILED) == 0 and len(trajs) == 8
    assert len({t.episode_id for t in trajs}) == 8
    assert [t.group_id for t in trajs] == [g[0].group_id for g in groups for _ in range(4)]


def test_llm_extractor_asks_the_runners_policy(setup):
    cfg, inputs, _ = setup

    def script(ctx):
        if "long-term memory of a conversation" not in ctx.text:  # the target turn
            return "<answer>unknown</answer>"
        message = re.findall(r"^(?:New message|Message) \[[^\]]*\] [^:]*: (.*)$", ctx.text, re.M)[-1]
        return json.dumps([{"op": "NOOP"}] if "?" in message else [{"op": "ADD", "text": message}])

    llm_cfg = dataclasses.replace(
        cfg,
        memory=dataclasses.replace(cfg.memory, extractor="llm"),
        episode=dataclasses.replace(cfg.episode, ingest_chunk_turns=1),
    )
    traj = build_runner(llm_cfg, policy=ScriptedPolicy(ByT5Tokenizer(), script)).run_batch(inputs[:1])[0]
    assert traj.status is EpisodeStatus.COMPLETED
    history = [s for s in traj.steps if s.turn_role is TurnRole.HISTORY]
    ops = [op.op for s in history for op in s.meta.memory_ops]
    questions = sum("?" in t.text for t in inputs[0].history)
    assert ops.count(MemoryOpType.ADD) == len(inputs[0].history) - questions
    assert ops.count(MemoryOpType.NOOP) == questions


def test_thread_count_is_chosen_again_between_write_steps_and_before_answering(setup, monkeypatch):
    """One evaluation batch can be a whole benchmark: the runner re-checks torch's threads as it writes and before
    it answers, not only once per batch (memrl.threads)."""
    from memrl.episode import runner as runner_module

    cfg, inputs, policy = setup
    cfg = dataclasses.replace(cfg, episode=dataclasses.replace(cfg.episode, ingest_chunk_turns=1))
    phases = []
    monkeypatch.setattr(runner_module, "follow_threads", phases.append)
    runner = build_runner(cfg, policy=policy)
    steps = []
    ingest = runner._ingest_chunk
    runner._ingest_chunk = lambda live, chunk: steps.append(len(phases)) or ingest(live, chunk)
    runner.run_batch(inputs[:3])
    longest = max(len(bi.history) for bi in inputs[:3])
    assert len(steps) == longest > 1
    assert steps == [i + 1 for i in range(longest)]  # a check right before every write step
    assert phases == ["memory writes"] * longest + ["answering"]


def test_questions_of_one_conversation_ingest_it_once_and_get_the_same_facts():
    from memrl.adapters import LOCOMO_FIXTURE

    cfg = load_config(
        None,
        [
            "data.adapter=locomo",
            f"data.path={LOCOMO_FIXTURE}",
            "data.options={}",
            "tools.enabled=[]",
            "rollout.n=1",
            "rollout.max_response_tokens=64",
            "episode.reward=locomo",
        ],
    )
    inputs, _ = load_dataset(cfg.data)
    policy = ScriptedPolicy(ByT5Tokenizer(), lambda ctx: "<answer>Not mentioned</answer>")
    shared = build_runner(cfg, policy=policy)
    extracted = []
    extract = shared.memory.extractor.extract
    shared.memory.extractor.extract = lambda requests: extracted.append(len(requests)) or extract(requests)
    together = shared.run_batch(inputs[:4])
    history = len(inputs[0].history)
    assert sum(extracted) == history + 4  # the history once, then each question's answer
    assert shared.metrics["memory/shared_ingests"] == 3

    def facts(traj):
        meta = traj.steps[-1].meta
        ops = [op for s in traj.steps for op in s.meta.memory_ops if op.op is MemoryOpType.RETRIEVE]
        return (
            [
                line
                for line in policy.tokenizer.decode(list(traj.steps[-1].prompt_ids)).splitlines()
                if line.startswith("- [")
            ],
            len(ops),
            meta.retrieved_ids,
        )

    alone = [build_runner(cfg, policy=policy).run_batch([bi])[0] for bi in inputs[:4]]
    for a, b in zip(together, alone, strict=True):
        assert a.status is b.status is EpisodeStatus.COMPLETED
        assert facts(a)[:2] == facts(b)[:2] and facts(a)[0]  # the same facts in the same prompt
    ids = [set(facts(t)[2]) for t in together]
    assert all(ids) and not ids[0] & ids[1]  # each episode owns its copy (renamed ids)
    assert shared.memory.store.namespaces() == []


def test_a_failed_ingest_fails_the_episodes_sharing_its_history_and_no_other(setup):
    cfg, inputs, policy = setup
    bad_turn = dataclasses.replace(inputs[1].history[0], text="BOOM " + inputs[1].history[0].text)
    bad = dataclasses.replace(inputs[1], turns=(bad_turn, *inputs[1].turns[1:]))
    twin = dataclasses.replace(bad, episode_id="twin", group_id="twin")  # same history as `bad`
    runner = build_runner(cfg, policy=policy)
    extract = runner.memory.extractor.extract

    def fragile(requests):
        if any("BOOM" in r.turn.text for r in requests):
            raise ValueError("unreadable turn")
        return extract(requests)

    runner.memory.extractor.extract = fragile
    trajs = runner.run_batch([inputs[0], bad, twin])
    assert [t.status for t in trajs] == [EpisodeStatus.COMPLETED, EpisodeStatus.FAILED, EpisodeStatus.FAILED]
    assert "unreadable turn" in trajs[1].failure_reason
    assert trajs[2].failure_reason.startswith("ingesting:") and bad.episode_id in trajs[2].failure_reason


def test_target_prompts_are_the_prompts_a_rollout_answers_and_generate_nothing(setup):
    """EpisodeRunner.target_prompts ingests as run_batch does and builds the same target prompt, without a
    generate call; a prompt over the budget or a repeated episode comes back as its failure reason; memory is released either way."""
    cfg, inputs, policy = setup
    trajs = build_runner(cfg, policy=policy).run_batch(inputs[:3])
    asked = []
    mute = ScriptedPolicy(ByT5Tokenizer(), lambda ctx: asked.append(ctx) or "")
    runner = build_runner(cfg, policy=mute)
    assert runner.target_prompts(inputs[:3]) == [t.steps[-1].prompt_ids for t in trajs]
    assert not asked and runner.memory.store.namespaces() == []
    tight = dataclasses.replace(cfg, episode=dataclasses.replace(cfg.episode, prompt_token_budget=20))
    got = build_runner(tight, policy=mute).target_prompts(inputs[:2])
    assert all(isinstance(g, str) and g.startswith("prompting:") for g in got)
    first, twin = runner.target_prompts([inputs[0], inputs[0]])
    assert first == trajs[0].steps[-1].prompt_ids and "duplicate episode_id" in twin
    assert runner.memory.store.namespaces() == []
