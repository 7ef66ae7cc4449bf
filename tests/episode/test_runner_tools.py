"""Runner + real tools: python calls run in the real sandbox, rollback events land in StepMeta, the search tool
queries the episode's own memory. A scripted policy stands in for the model (deterministic state machine)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
from transformers import ByT5Tokenizer

from memrl.config import load_config
from memrl.data.adapters import load_dataset
from memrl.episode.build import build_runner
from memrl.episode.rows import step_meta_of_row, step_rows
from memrl.testing.scripted import ScriptedPolicy
from memrl.types import EpisodeStatus


def _script(ctx):
    """First a broken call (NameError → rollback), then a fixed one, then answer with the tool's result."""
    tail = ctx.text.rsplit("<|assistant|>", 1)[-1]
    if "Write a corrected call" in tail and tail.count("<python>") == 1:
        return "<python>print(6 * 7)</python>"
    if "<result>" not in tail:
        return "<python>print(undefined_name)</python>"
    results = re.findall(r"<result>(.*?)</result>", tail, re.DOTALL)
    return f"<answer>{results[-1].strip()}</answer>"


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return load_config(
        None,
        [
            "data.adapter=synthetic",
            "data.options={num_episodes: 3}",
            "tools.enabled=[python, search]",
            "memory.neighbour_turns=0",  # one fact per turn: the assertions read single facts
            "rollout.n=1",
            "rollout.max_response_tokens=200",
            "rollout.rollback.enable_tool_rollback=true",
            "episode.reward=composite",
            "episode.reward_options={parts: {exact_match: 1.0, format: 0.5}}",
        ],
    )


def test_tool_calls_and_rollbacks_reach_step_meta(cfg):
    tok = ByT5Tokenizer()
    policy = ScriptedPolicy(tok, _script)
    runner = build_runner(cfg, policy=policy)
    inputs, _ = load_dataset(cfg.data)
    try:
        trajs = runner.run_batch(inputs)
        metrics = runner.snapshot_metrics()
    finally:
        runner.tools.close()
    assert [t.status for t in trajs] == [EpisodeStatus.COMPLETED] * len(inputs)
    for traj in trajs:
        step = traj.steps[-1]
        assert [c.name for c in step.meta.tool_calls] == ["python"]
        assert step.meta.tool_calls[0].status == "ok" and step.meta.tool_calls[0].result.strip() == "42"
        assert len(step.meta.rollbacks) == 1 and "NameError" in step.meta.rollbacks[0].error
        assert step.meta.rollbacks[0].repaired
        # only the corrected call stays in the trajectory; tool output has mask 0
        text = tok.decode(list(step.response_ids))
        assert "undefined_name" not in text and "print(6 * 7)" in text
        masked = tok.decode([t for t, m in zip(step.response_ids, step.response_mask, strict=True) if m == 0])
        assert "42" in masked
        assert traj.reward == pytest.approx(0.5)  # well-formed (format 1.0 * 0.5), wrong answer (42 ≠ gold)
    assert metrics["tools/python/calls"] >= 2 * len(inputs) and metrics["episode/time_tools_s"] > 0
    # the gold answer reaches the trajectory (replay's gold demonstrations read it) and survives the Parquet row
    assert [t.steps[-1].meta.gold_answer for t in trajs] == [bi.target_answer for bi in inputs]
    row = [r for r in step_rows(trajs[:1]) if r["turn_role"] == "target"][0]
    assert step_meta_of_row(row).gold_answer == inputs[0].target_answer is not None
    # so does the gold program of an arithmetic question (program demonstrations read it)
    programs = [bi.metadata.get("gold_python") for bi in inputs]
    assert [t.steps[-1].meta.gold_python for t in trajs] == programs and any(programs)
    arithmetic = programs.index(next(p for p in programs if p))
    row = [r for r in step_rows(trajs[arithmetic : arithmetic + 1]) if r["turn_role"] == "target"][0]
    assert step_meta_of_row(row).gold_python == programs[arithmetic]
    assert row["num_tool_calls"] == 1 and row["num_rollbacks"] == 1
    assert json.loads(row["rollbacks"])[0]["repaired"] is True


def test_search_tool_reads_the_episode_memory(cfg):
    tok = ByT5Tokenizer()
    seen = []

    def script(ctx):
        tail = ctx.text.rsplit("<|assistant|>", 1)[-1]
        if "<result>" not in tail:
            return "<search>city</search>"
        seen.append(re.findall(r"<result>(.*?)</result>", tail, re.DOTALL)[-1])
        return "<answer>x</answer>"

    # search results are long (five dated facts); give the response room for them
    big = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, max_response_tokens=1500))
    runner = build_runner(big, policy=ScriptedPolicy(tok, script))
    inputs, _ = load_dataset(cfg.data)
    try:
        runner.run_batch(inputs[:1])
    finally:
        runner.tools.close()
    history_text = " ".join(t.text for t in inputs[0].history)
    assert seen, "the model saw the search result"
    facts = re.findall(r"\] \([^)]*\) \w+: (.*?) \(sources", seen[0])
    assert facts and all(f in history_text for f in facts)  # facts come from this episode's own history
