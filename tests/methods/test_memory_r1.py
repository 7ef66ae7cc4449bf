"""Memory-R1 from memrl's parts (memrl.methods.memory_r1): the answer agent's distillation template, exact match
on its tagged answer, and the manager's operations scored by that answer agent on store copies. A scripted
policy, real MiniLM + FAISS."""

from __future__ import annotations

import re

import pytest
from transformers import ByT5Tokenizer

from memrl.config import load_config
from memrl.data.adapters import load_dataset
from memrl.episode.build import build_runner
from memrl.methods.memory_r1 import ANSWER_TEMPLATE
from memrl.testing.scripted import ScriptedPolicy
from memrl.types import StepRole

_TURN = re.compile(r"^\[[^\]]*\] [A-Z][a-z]+: (.*)$", re.M)
_FACT = re.compile(r"^- \[[^\]]*\] (.*?)$", re.M)


def script(ctx):
    """Manager: ADD every statement about a person. Answer agent: copies the memory lines naming the person asked
    about between <memories> tags, then answers with the newest one's last word."""
    if re.search(r"Operations:\s*(<\|assistant\|>)?\s*$", ctx.text):
        new = ctx.text.rsplit("New:", 1)[-1]
        lines = [
            f"ADD {t}" if re.search(r"\b(is|has|lives|called)\b", t) else "NOOP" for t in _TURN.findall(new)
        ]
        return "\n".join(lines) or "NOOP"
    assert "between <memories> and </memories>" in ctx.text  # the distillation instruction reached the prompt
    question = ctx.text.rsplit("?", 1)[0].split("\n")[-1]
    names = re.findall(r"\b([A-Z][a-z]+)\b", question)[1:]
    hits = [f for f in _FACT.findall(ctx.text) if any(n in f for n in names)]
    answer = hits[-1].rstrip(".").split()[-1] if hits else "unknown"
    return f"<memories>{' '.join(hits)}</memories><answer>{answer}</answer>"


def _cfg(*extra):
    return load_config(
        None,
        [
            "data.options={num_episodes: 3}",
            "tools.enabled=[]",
            "rollout.n=2",
            "rollout.max_response_tokens=600",
            "memory.extractor=policy",
            "memory.write_max_tokens=400",
            "memory.top_k=4",
            "memory.neighbour_turns=0",
            "episode.record_history_turns=false",
            "episode.ingest_chunk_turns=6",
            f"episode.prompt_template={ANSWER_TEMPLATE}",
            "episode.reward=exact_match",
            "episode.memory_credit.name=snapshot",
            "episode.memory_credit.snapshot_score=answer",
            "episode.memory_credit.snapshot_k=3",
            "episode.memory_credit.snapshot_writes=1",
            "episode.memory_credit.format_weight=0.0",
            "episode.memory_credit.op_weight=0.0",
            "rollout.temperature=1.0",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def run():
    cfg = _cfg()
    inputs, _ = load_dataset(cfg.data)
    return inputs, build_runner(cfg, policy=ScriptedPolicy(ByT5Tokenizer(), script)).run_batch(inputs)


def test_the_distilled_answer_scores_exact_match_on_its_tag(run):
    inputs, trajs = run
    gold = {i.episode_id: i.target_answer for i in inputs}
    tokenizer = ByT5Tokenizer()
    for traj in trajs:
        text = tokenizer.decode(list(traj.steps[-1].response_ids), skip_special_tokens=True)
        m = re.fullmatch(r"<memories>(.*)</memories><answer>(.*)</answer>", text)
        assert m is not None, text
        assert traj.reward == float(m[2].lower() == gold[traj.source_episode_id].lower())
    assert any(t.reward == 1.0 for t in trajs) and any(t.reward == 0.0 for t in trajs)


def test_the_managers_alternatives_are_scored_by_the_answer_agent(run):
    _, trajs = run
    seen = 0
    for traj in trajs:
        writes = [s for s in traj.steps if s.meta.role is StepRole.MEMORY]
        group = [s for s in writes if s.meta.write.alternatives == 3]
        if not group:
            continue
        seen += 1
        assert len({s.meta.credit_group for s in group}) == 1
        assert all(s.meta.write.snapshot_reward in (0.0, 1.0) for s in group)  # exact match on a store copy
    assert seen == 3
