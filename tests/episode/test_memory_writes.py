"""Episodes whose memory the policy writes (memory.extractor: policy): steps, step credit, snapshot groups,
batching. A scripted policy (deterministic), real MiniLM + FAISS."""

from __future__ import annotations

import dataclasses
import re

import pytest
from transformers import ByT5Tokenizer

from memrl.config import load_config
from memrl.data.adapters import load_dataset
from memrl.data.batch import TrajectoryBatchBuilder, unpack_steps
from memrl.data.config import BatchConfig
from memrl.episode.build import build_runner
from memrl.episode.credit import written_ids
from memrl.testing.scripted import ScriptedPolicy
from memrl.types import StepRole

_TURN = re.compile(r"^\[[^\]]*\] [A-Z][a-z]+: (.*)$", re.M)


def script(ctx):
    """Writes: ADD every turn that states something about a person (else NOOP). Answers: the last word of the
    newest fact line naming the person asked about."""
    if re.search(r"Operations:\s*(<\|assistant\|>)?\s*$", ctx.text):  # a memory write (plain chat format)
        new = ctx.text.rsplit("New:", 1)[-1]
        lines = [
            f"ADD {t}" if re.search(r"\b(is|has|lives|called)\b", t) and "?" not in t else "NOOP"
            for t in _TURN.findall(new)
        ]
        return "\n".join(lines) or "NOOP"
    question = ctx.text.rsplit("?", 1)[0]
    names = re.findall(r"\b([A-Z][a-z]+)\b", question.split("\n")[-1])
    facts = re.findall(r"^- \[[^\]]*\] (.*?)$", ctx.text, re.M)
    hits = [f for f in facts if any(n in f for n in names[1:])]
    return f"<answer>{hits[-1].rstrip('.').split()[-1] if hits else 'unknown'}</answer>"


def _cfg(*extra):
    return load_config(
        None,
        [
            "data.options={num_episodes: 4}",
            "tools.enabled=[]",
            "rollout.n=2",
            "rollout.max_response_tokens=48",
            "memory.extractor=policy",
            "memory.write_max_tokens=400",
            "memory.top_k=4",
            "memory.neighbour_turns=0",
            "episode.record_history_turns=false",
            "episode.ingest_chunk_turns=6",
            "episode.memory_credit.format_weight=0.0",
            "episode.memory_credit.op_weight=0.0",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def policy():
    return ScriptedPolicy(ByT5Tokenizer(), script)


@pytest.fixture(scope="module")
def used_run(policy):
    cfg = _cfg()
    inputs, _ = load_dataset(cfg.data)
    return cfg, build_runner(cfg, policy=policy).run_batch(inputs)


def _writes(traj):
    return [
        (s, r)
        for s, r in zip(traj.steps, traj.step_rewards_ext, strict=True)
        if s.meta.role is StepRole.MEMORY
    ]


def test_each_write_is_a_trainable_history_step(used_run):
    cfg, trajs = used_run
    leaf0 = [t for t in trajs if t.episode_id.endswith("#0")]
    assert len(leaf0) == 4
    for traj in leaf0:
        writes = _writes(traj)
        assert len(writes) == 3  # 18 history turns, 6 per write
        for step, _ in writes:
            assert step.response_mask == (1,) * len(step.response_ids) and len(step.logprobs) == len(
                step.response_ids
            )
            assert step.meta.extra["read_turns"] and step.meta.credit_group.endswith("/memory")
            assert step.trainable
    # Only leaf 0 carries the writes (the memory is the episode's, shared by its leaves).
    assert all(not _writes(t) for t in trajs if t.episode_id.endswith("#1"))


def test_used_credit_reaches_exactly_the_writes_whose_facts_were_in_the_prompt(used_run):
    _, trajs = used_run
    seen_used = seen_unused = 0
    for traj in (t for t in trajs if t.episode_id.endswith("#0")):
        source = traj.source_episode_id
        leaves = [t for t in trajs if t.source_episode_id == source]
        outcome = sum(t.reward for t in leaves) / len(leaves)
        used = set(traj.steps[-1].meta.included_fact_ids)
        for step, credit in _writes(traj):
            if written_ids(step) & used:
                assert credit == pytest.approx(outcome)
                seen_used += 1
            else:
                assert credit == 0.0
                seen_unused += 1
    assert seen_used and seen_unused  # both cases occur


def test_memory_rows_round_trip_through_the_batch_builder(used_run):
    _, trajs = used_run
    batch = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(trajs)
    rows = {r.step_id: r for r in unpack_steps(batch)}
    for traj in trajs:
        for step, credit in _writes(traj):
            row = rows[step.step_id]
            assert row.response_ids == step.response_ids and row.response_mask == step.response_mask
            assert row.logprobs == pytest.approx(step.logprobs)
            i = batch.step_ids.index(step.step_id)
            assert float(batch.rewards[i]) == pytest.approx(credit)
            assert batch.group_ids[i] == step.meta.credit_group != traj.group_id


def test_broadcast_gives_every_write_the_outcome(policy):
    cfg = _cfg("episode.memory_credit.name=broadcast")
    inputs, _ = load_dataset(cfg.data)
    trajs = build_runner(cfg, policy=policy).run_batch(inputs[:2])
    for traj in (t for t in trajs if t.episode_id.endswith("#0")):
        leaves = [t for t in trajs if t.source_episode_id == traj.source_episode_id]
        outcome = sum(t.reward for t in leaves) / len(leaves)
        assert [c for _, c in _writes(traj)] == pytest.approx([outcome] * 3)


def test_snapshot_groups_k_alternatives_scored_on_forks(policy):
    cfg = _cfg("episode.memory_credit.name=snapshot", "episode.memory_credit.snapshot_k=3",
               "episode.memory_credit.snapshot_writes=1", "rollout.temperature=1.0")  # fmt: skip
    inputs, _ = load_dataset(cfg.data)
    runner = build_runner(cfg, policy=policy)
    trajs = runner.run_batch(inputs[:2])
    for traj in (t for t in trajs if t.episode_id.endswith("#0")):
        writes = _writes(traj)
        alts = [(s, c) for s, c in writes if s.meta.write.alternatives == 3]
        assert len(alts) == 3 and len({s.meta.credit_group for s, _ in alts}) == 1
        assert [s.meta.write.applied for s, _ in alts] == [True, False, False]
        assert all(c == s.meta.write.snapshot_reward for s, c in alts)
        # The writes that were not sampled as a group train nothing under snapshot credit.
        assert all(c is None for s, c in writes if s.meta.write.alternatives == 1)
        # The planned write is the one that read the question's evidence turn.
        inp = next(bi for bi in inputs if bi.episode_id == traj.source_episode_id)
        i = alts[0][0].meta.write.index
        read_ids = {t.turn_id for t in inp.history[6 * i : 6 * (i + 1)]}
        assert read_ids & set(inp.metadata["evidence_turn_ids"])
    assert not [ns for ns in runner.memory.store.namespaces() if "~fork" in ns]  # forks released
    assert runner.metrics["episode/time_snapshot_s"] > 0


def _snapshot_rewards(trajs) -> dict[str, list[float]]:
    return {
        t.source_episode_id: [
            s.meta.write.snapshot_reward for s, _ in _writes(t) if s.meta.write.alternatives > 1
        ]
        for t in trajs
        if _writes(t)  # the leaf that carries the writes
    }


def test_snapshot_questions_all_scores_a_fork_on_every_question_over_its_history(tiny_hf_policy):
    """Two episodes over one history (as the questions of one LoCoMo conversation) with different gold answers,
    a real model forward: with ``snapshot_questions=all`` each fork's outcome is the mean of both questions' on it."""
    base = ("episode.memory_credit.name=snapshot", "episode.memory_credit.snapshot_k=3",
            "episode.memory_credit.snapshot_writes=1", "episode.memory_credit.snapshot_score=gold_logprob",
            "rollout.temperature=0.0", "rollout.n=1", "memory.write_max_tokens=12",
            "rollout.max_response_tokens=4")  # fmt: skip
    inputs, _ = load_dataset(_cfg(*base).data)
    right = inputs[0]
    other = dataclasses.replace(right, episode_id=right.episode_id + "-other", target_answer="zzzz")

    def rewards(*extra):
        trajs = build_runner(_cfg(*base, *extra), policy=tiny_hf_policy).run_batch([right, other])
        return _snapshot_rewards(trajs)

    # greedy writes (temperature 0): both episodes fork the same write of the same memory, deterministically
    own = rewards()
    both = rewards("episode.memory_credit.snapshot_questions=all")
    assert len(own[right.episode_id]) == 3 and own[right.episode_id] != own[other.episode_id]
    mean = [(a + b) / 2 for a, b in zip(own[right.episode_id], own[other.episode_id], strict=True)]
    # One trunk for the history: the first episode carries the group (both planned the same write), scored on both.
    assert both == {right.episode_id: pytest.approx(mean)}


def test_snapshot_questions_all_writes_one_trunk_per_history_with_its_planned_writes(policy):
    """Episodes over one history under ``snapshot_questions=all``: the first writes the trunk once with the
    history's ``snapshot_writes`` groups, each question's evidence write first in turn; the others copy its
    memory and carry no write steps."""
    cfg = _cfg("episode.memory_credit.name=snapshot", "episode.memory_credit.snapshot_k=3",
               "episode.memory_credit.snapshot_writes=2", "episode.memory_credit.snapshot_questions=all",
               "rollout.temperature=1.0", "rollout.n=1")  # fmt: skip
    inputs, _ = load_dataset(cfg.data)
    first = inputs[0]
    # Three questions over the first history, planning different writes (evidence in each of its 3 chunks).
    history = first.history
    asked = [
        dataclasses.replace(
            first,
            episode_id=f"{first.episode_id}-q{i}",
            group_id=f"{first.group_id}-q{i}",
            metadata={**first.metadata, "evidence_turn_ids": [history[6 * i].turn_id]},
        )
        for i in range(3)
    ]
    runner = build_runner(cfg, policy=policy)
    trajs = runner.run_batch([*asked, inputs[1]])
    assert runner.metrics["memory/writes"] == 3 + 3  # one trunk of 3 writes per distinct history
    assert runner.metrics["memory/shared_ingests"] == 2
    by_id = {t.episode_id: t for t in trajs}
    groups = [
        s.meta.write.index for s, _ in _writes(by_id[asked[0].episode_id]) if s.meta.write.alternatives == 3
    ]
    # 2 groups for the trunk: the evidence writes of the first two questions (the third's is cut)
    assert sorted(set(groups)) == [0, 1] and len(groups) == 6
    assert not _writes(by_id[asked[1].episode_id]) and not _writes(by_id[asked[2].episode_id])
    # the copies answered from the same memory the leader built
    facts = [by_id[a.episode_id].steps[-1].meta.retrieved_ids for a in asked]
    assert all(len(f) > 0 for f in facts)
    assert len([s for s, _ in _writes(by_id[inputs[1].episode_id]) if s.meta.write.alternatives == 3]) == 6


def test_snapshot_questions_must_be_one_the_scorer_knows():
    with pytest.raises(ValueError, match=r"snapshot_questions must be one of \['own', 'all'\]"):
        _cfg("episode.memory_credit.snapshot_questions=every")


def test_snapshot_writes_the_trunk_greedily_and_samples_only_the_groups(policy):
    """The episode's own store gets the greedy reply of every write, as at test, so a group is compared inside the
    memory the writer will build there, and that memory can come from the write cache; only a planned write's
    other alternatives are sampled."""
    seen: list[tuple[int, float]] = []

    class Recording:
        def __init__(self, inner) -> None:
            self.inner = inner

        def generate(self, requests):
            seen.extend((r.params.n, r.params.temperature) for r in requests if "Operations:" in _text(r))
            return self.inner.generate(requests)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    def _text(req) -> str:
        return policy.tokenizer.decode(list(req.prompt_ids))

    cfg = _cfg("episode.memory_credit.name=snapshot", "episode.memory_credit.snapshot_k=3",
               "episode.memory_credit.snapshot_writes=1", "rollout.temperature=1.0")  # fmt: skip
    inputs, _ = load_dataset(cfg.data)
    build_runner(cfg, policy=Recording(policy)).run_batch(inputs[:2])
    # every write's reply 0 greedy (the scripted policy counts as not cached); a planned write's 2 others sampled
    assert {(n, t) for n, t in seen} == {(1, 0.0), (2, 1.0)}
    assert sum(1 for n, _ in seen if n == 2) == 2  # one planned write per episode


def test_local_credit_groups_k_alternatives_at_every_write_scored_by_the_step_terms(policy):
    cfg = _cfg("episode.memory_credit.name=local", "episode.memory_credit.snapshot_k=3",
               "episode.memory_credit.format_weight=0.2", "episode.memory_credit.op_weight=0.5",
               "episode.memory_credit.unsupported_weight=0.5", "rollout.temperature=1.0")  # fmt: skip
    inputs, _ = load_dataset(cfg.data)
    runner = build_runner(cfg, policy=policy)
    trajs = runner.run_batch(inputs[:2])
    for traj in (t for t in trajs if t.episode_id.endswith("#0")):
        writes = _writes(traj)
        assert len(writes) == 3 * 3  # every write of 6 turns, 3 alternatives each
        groups: dict[str, list] = {}
        for step, credit in writes:
            groups.setdefault(step.meta.credit_group, []).append((step, credit))
            write = step.meta.write
            # No answering: the reward is the per-step terms alone.
            expected = (
                0.2 * (not write.format_errors) + 0.5 * write.op_score - 0.5 * bool(write.unsupported_facts)
            )
            assert credit == pytest.approx(expected)
            written = [
                line for line in step.meta.response_text.splitlines() if line.startswith(("ADD", "UPDATE"))
            ]
            assert write.facts_written == len(written) and len(write.turn_kinds) == 6
        assert len(groups) == 3
        for members in groups.values():
            assert [s.meta.write.applied for s, _ in members] == [True, False, False]
            assert len({s.prompt_ids for s, _ in members}) == 1  # one store state, one prompt
            assert len({s.meta.write.index for s, _ in members}) == 1
    assert runner.memory._forks == 0  # scored unapplied: no store copies
    assert "episode/time_snapshot_s" not in runner.metrics


def test_a_policy_writer_never_shares_ingest_between_identical_histories(policy):
    cfg = _cfg()
    inputs, _ = load_dataset(cfg.data)
    twin = dataclasses.replace(inputs[0], episode_id=inputs[0].episode_id + "-twin")
    trajs = build_runner(cfg, policy=policy).run_batch([inputs[0], twin])
    own = {t.source_episode_id: len(_writes(t)) for t in trajs if t.episode_id.endswith("#0")}
    assert own == {inputs[0].episode_id: 3, twin.episode_id: 3}


@pytest.mark.parametrize("temperature, writes", [(0.0, 3), (1.0, 6)])
def test_greedy_writes_of_one_history_are_written_once_and_shared(policy, temperature, writes):
    """Two questions over one history (as LoCoMo's): greedy, the first episode writes the memory and the other
    copies it; sampled, each writes its own (its writes are its trainable steps)."""
    cfg = _cfg("rollout.n=1", f"rollout.temperature={temperature}")
    inputs, _ = load_dataset(cfg.data)
    twins = [inputs[0], dataclasses.replace(inputs[0], episode_id=inputs[0].episode_id + "-again")]
    runner = build_runner(cfg, policy=policy)
    trajs = runner.run_batch(twins)
    assert runner.metrics["memory/writes"] == writes
    assert runner.metrics.get("memory/shared_ingests", 0) == (1 if temperature == 0 else 0)
    assert [len(_writes(t)) for t in trajs] == ([3, 0] if temperature == 0 else [3, 3])
    prompts = [t.steps[-1].meta.included_fact_ids for t in trajs]
    assert prompts[0] and len(prompts[0]) == len(prompts[1])  # the copy answers from the same facts


def test_a_writer_left_untrained_writes_greedily_without_alternatives(policy, monkeypatch):
    """Training that does not train the writer (``sample_writes=False``): writes are greedy at any rollout
    temperature (the memory it will write at test), no alternatives are sampled, and one history is written once."""
    cfg = _cfg("rollout.n=1", "rollout.temperature=1.0", "episode.memory_credit.name=local",
               "episode.memory_credit.snapshot_k=3", "episode.memory_credit.op_weight=0.5")  # fmt: skip
    inputs, _ = load_dataset(cfg.data)
    twins = [inputs[0], dataclasses.replace(inputs[0], episode_id=inputs[0].episode_id + "-again")]
    seen: list[tuple[float, int]] = []
    generate = policy.generate

    def recording(requests):
        # Writes are the requests with the writer's token budget (memory.write_max_tokens=400; answers: 48).
        seen.extend((r.params.temperature, r.params.n) for r in requests if r.params.max_tokens == 400)
        return generate(requests)

    runner = build_runner(cfg, policy=policy, sample_writes=False)
    monkeypatch.setattr(policy, "generate", recording)
    trajs = runner.run_batch(twins)
    assert seen and set(seen) == {(0.0, 1)}
    assert runner.metrics["memory/writes"] == 3 and runner.metrics["memory/shared_ingests"] == 1
    assert [len(_writes(t)) for t in trajs] == [3, 0]
    assert [s.meta.write.applied for s, _ in _writes(trajs[0])] == [True] * 3  # no unapplied alternatives


def test_policy_writes_log_how_far_they_got_at_most_once_a_minute(caplog):
    """Writing a LoCoMo conversation turn by turn takes minutes: the runner logs the turns written so far."""
    import logging
    import time
    from types import SimpleNamespace

    from memrl.episode.runner import _log_writes

    states = [
        SimpleNamespace(cursor=c, inp=SimpleNamespace(history=[None] * n)) for c, n in ((10, 40), (30, 60))
    ]
    now = time.perf_counter()
    with caplog.at_level(logging.INFO, logger="memrl.episode.runner"):
        assert _log_writes(states, now - 5, now - 1) == now - 1  # a line a second ago: none now
        assert not caplog.records
        last = _log_writes(states, now - 125, now - 65)
    assert last >= now
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "memory writes: 40 of 100 history turns written"
    ]


def test_snapshot_gold_logprob_scores_each_fork_by_the_gold_answers_likelihood(tiny_hf_policy):
    """snapshot_score=gold_logprob, a real model forward: each alternative's outcome is exp(mean log p) of
    ``<answer>gold</answer>`` + eos over its fork's prompt, from one scoring call per batch of forks."""
    import math

    from memrl.formats import format_answer

    cfg = _cfg("episode.memory_credit.name=snapshot", "episode.memory_credit.snapshot_k=3",
               "episode.memory_credit.snapshot_writes=1", "episode.memory_credit.snapshot_score=gold_logprob",
               "rollout.temperature=1.0", "rollout.n=1", "memory.write_max_tokens=12",
               "rollout.max_response_tokens=4")  # fmt: skip
    inputs, _ = load_dataset(cfg.data)
    policy, tok = tiny_hf_policy, tiny_hf_policy.tokenizer
    calls: list[tuple[list, list[list[float]]]] = []
    real = policy.logprobs

    def spy(sequences, **kw):
        out = real(sequences, **kw)
        calls.append((list(sequences), out))
        return out

    policy.logprobs = spy
    try:
        trajs = build_runner(cfg, policy=policy).run_batch(inputs[:2])
    finally:
        del policy.logprobs
    scored = {}  # gold reply -> the likelihoods the scorer computed for it
    for sequences, lps in calls:
        for (_, reply), lp in zip(sequences, lps, strict=True):
            scored.setdefault(tuple(reply), []).append(math.exp(sum(lp) / len(lp)))
    # one planned write per episode, 3 forks each: a prompt the forks share is scored once
    pairs = [(tuple(p), tuple(r)) for s, _ in calls for p, r in s]
    assert 2 <= len(pairs) <= 2 * 3 and len(set(pairs)) == len(pairs)
    for traj in trajs:
        inp = next(bi for bi in inputs if bi.episode_id == traj.source_episode_id)
        gold = [
            *tok(format_answer(inp.target_answer), add_special_tokens=False)["input_ids"],
            tok.eos_token_id,
        ]
        alts = [s for s, _ in _writes(traj) if s.meta.write.alternatives == 3]
        rewards = [s.meta.write.snapshot_reward for s in alts]
        assert len(alts) == 3 and all(0 < r <= 1 for r in rewards)
        assert all(any(r == pytest.approx(x) for x in scored[tuple(gold)]) for r in rewards)
