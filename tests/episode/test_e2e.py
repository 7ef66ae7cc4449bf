"""End to end: synthetic episodes through the real tiny Llama (random init), real MiniLM + FAISS memory, the real
chain/tree rollout, the reward registry, the Parquet writer and the TrajectoryBatchBuilder."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from memrl.config import load_config
from memrl.data.adapters import load_dataset
from memrl.data.batch import TrajectoryBatchBuilder, unpack_steps
from memrl.episode.build import build_runner
from memrl.episode.pipeline import run_episodes
from memrl.policy import make_policy
from memrl.types import BatchInput, EpisodeStatus, MemoryOpType, TurnRole


def _cfg(model_dir: str, tmp_path, *extra: str):
    return load_config(
        None,
        [
            f"policy.model={model_dir}",
            f"output_dir={tmp_path / 'run'}",
            "data.adapter=synthetic",
            "data.split=train",
            "data.options={num_episodes: 4}",
            "tools.enabled=[]",
            "rollout.n=2",
            "rollout.max_response_tokens=12",
            "episode.batch_size=4",
            *extra,
        ],
    )


@pytest.fixture(scope="module")
def policy_and_cfg(tiny_llama_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e")
    cfg = _cfg(tiny_llama_dir, tmp)
    return make_policy(cfg.policy), cfg, tmp


def test_batch_runs_and_lines_up_with_packed_batch(policy_and_cfg):
    policy, cfg, _ = policy_and_cfg
    inputs, _ = load_dataset(cfg.data)
    runner = build_runner(cfg, policy=policy)
    trajs = runner.run_batch(inputs)
    assert len(trajs) == len(inputs) * cfg.rollout.n
    assert [t.status for t in trajs] == [EpisodeStatus.COMPLETED] * len(trajs) or all(
        t.status in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED) for t in trajs
    )
    # leaves of one input are adjacent, share the group id, and keep input order
    assert [t.group_id for t in trajs] == [bi.group_id for bi in inputs for _ in range(cfg.rollout.n)]
    first = trajs[0]
    hist = [s for s in first.steps if s.turn_role is TurnRole.HISTORY]
    assert len(hist) == len(inputs[0].history)
    added = {
        fid for s in hist for op in s.meta.memory_ops if op.op is MemoryOpType.ADD for fid in op.fact_ids
    }
    assert added, "history steps carry the ADD ops of their turn"
    target = first.steps[-1]
    retrieve = [op for op in target.meta.memory_ops if op.op is MemoryOpType.RETRIEVE]
    assert len(retrieve) == 1 and set(retrieve[0].fact_ids) <= added
    assert set(target.meta.retrieved_ids) == set(retrieve[0].fact_ids)
    # the retrieved facts were rendered into the prompt that the model saw
    prompt_text = policy.tokenizer.decode(list(target.prompt_ids))
    assert "Memory:" in prompt_text and inputs[0].final_query in prompt_text

    batch = TrajectoryBatchBuilder(cfg.data.batch).build(trajs)
    targets = [(t, s) for t in trajs for s in t.steps if s.turn_role is TurnRole.TARGET]
    assert batch.num_steps == len(targets)
    for row, (_traj, step) in zip(unpack_steps(batch), targets, strict=True):
        assert list(row.prompt_ids) == list(step.prompt_ids)
        assert list(row.response_ids) == list(step.response_ids)
        assert list(row.response_mask) == list(step.response_mask)
    assert batch.rewards.tolist() == pytest.approx([t.reward for t, _ in targets])
    assert batch.episode_ids == [t.episode_id for t, _ in targets]


def test_failing_episode_does_not_take_down_the_batch(policy_and_cfg):
    policy, cfg, _ = policy_and_cfg
    inputs, _ = load_dataset(cfg.data)
    bad_q = "why? " * 400  # cannot fit the prompt budget even without memory
    bad = BatchInput(
        "bad-episode",
        "bad-group",
        inputs[0].turns[:-1] + (inputs[0].turns[-1].__class__("target", bad_q, "Q"),),
        bad_q,
    )
    runner = build_runner(cfg, policy=policy)
    trajs = runner.run_batch([inputs[0], bad, inputs[1]])
    by_id = {}
    for t in trajs:
        by_id.setdefault(t.episode_id.split("#")[0], []).append(t)
    assert [t.status for t in by_id["bad-episode"]] == [EpisodeStatus.FAILED]
    assert "prompting" in by_id["bad-episode"][0].failure_reason
    assert "prompt_token_budget" in by_id["bad-episode"][0].failure_reason
    assert all(
        t.status is not EpisodeStatus.FAILED for k, ts in by_id.items() if k != "bad-episode" for t in ts
    )
    assert len(by_id) == 3


def test_run_writes_parquet_that_round_trips_and_resumes(policy_and_cfg, tmp_path):
    policy, cfg, _ = policy_and_cfg
    out = tmp_path / "run"
    inputs, _ = load_dataset(cfg.data)
    m1 = run_episodes(cfg, out, inputs=inputs[:2], policy=policy, progress=False)
    assert m1["run/inputs"] == 2
    m2 = run_episodes(cfg, out, inputs=inputs, policy=policy, progress=False)
    assert m2["run/inputs"] == 4 and m2["run/episodes_this_session"] == 2  # first two skipped
    frame = pd.read_parquet(out / "trajectories")
    manifests = [
        e for p in sorted((out / "manifests").glob("*.json")) for e in json.loads(p.read_text())["episodes"]
    ]
    assert sorted({e["source_episode_id"] for e in manifests}) == sorted(bi.episode_id for bi in inputs)
    assert len(manifests) == len({e["episode_id"] for e in manifests})  # no duplicates
    assert len(frame) == sum(e["num_steps"] for e in manifests)
    tgt = frame[frame.turn_role == "target"]
    assert len(tgt) == 4 * cfg.rollout.n
    assert (tgt.response_mask.map(len) == tgt.response_ids.map(len)).all()
    ops = [json.loads(s) for s in frame[frame.turn_role == "history"].memory_ops]
    assert any(op["op"] == "ADD" for row in ops for op in row)
    assert all("RETRIEVE" in types for types in tgt.memory_op_types)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["run/episodes"] == len(manifests) and metrics["run/peak_rss_mb"] > 0
    # The HF policy's forward counters: every forward feeds at least one row, every row at least one token.
    assert (
        0
        < metrics["policy/forward_calls"]
        <= metrics["policy/forward_rows"]
        <= metrics["policy/forward_tokens"]
    )
    assert metrics["policy/forward_seconds"] > 0

    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_files=str(out / "trajectories" / "*.parquet"), split="train")
    assert len(ds) == len(frame) and ds[0]["prompt_ids"] == list(frame.iloc[0].prompt_ids)


def test_run_draws_copies_through_the_buffer_and_dumps_each_part(policy_and_cfg, tmp_path):
    """data.n_samples_per_prompt copies all run (distinct ids, one group) and data.dump_dir dumps every part."""
    import dataclasses

    from memrl.data.buffer import read_rollout_dump

    policy, cfg, _ = policy_and_cfg
    cfg = dataclasses.replace(
        cfg, data=dataclasses.replace(cfg.data, n_samples_per_prompt=2, dump_dir=str(tmp_path / "dumps"))
    )
    inputs, _ = load_dataset(cfg.data)
    metrics = run_episodes(cfg, tmp_path / "run", inputs=inputs[:2], policy=policy, progress=False)
    assert metrics["run/failed"] == 0 and metrics["run/inputs"] == 4  # 2 prompts x 2 copies, none a duplicate
    [dump] = sorted((tmp_path / "dumps").glob("rollout_*.jsonl"))
    episodes = read_rollout_dump(dump)
    assert len(episodes) == 4 * cfg.rollout.n
    assert {e.group_id for e in episodes} == {f"{bi.episode_id}@e0" for bi in inputs[:2]}
    again = run_episodes(cfg, tmp_path / "run", inputs=inputs[:2], policy=policy, progress=False)
    assert again["run/episodes_this_session"] == 0  # resume knows the copies by their own ids


def test_resume_refuses_a_changed_job_until_fresh(policy_and_cfg, tmp_path):
    import dataclasses

    from memrl.episode.evaluate import clear_results

    policy, cfg, _ = policy_and_cfg
    out = tmp_path / "run"
    inputs, _ = load_dataset(cfg.data)
    run_episodes(cfg, out, inputs=inputs[:1], policy=policy, progress=False)
    other = dataclasses.replace(cfg, rollout=dataclasses.replace(cfg.rollout, temperature=0.5))
    with pytest.raises(ValueError, match=r"different job \(changed: rollout\).*--fresh"):
        run_episodes(other, out, inputs=inputs[:2], policy=policy, progress=False)
    moved = dataclasses.replace(cfg, output_dir="elsewhere", episode=dataclasses.replace(cfg.episode))
    assert run_episodes(moved, out, inputs=inputs[:2], policy=policy, progress=False)["run/inputs"] == 2
    clear_results(out)
    assert run_episodes(other, out, inputs=inputs[:1], policy=policy, progress=False)["run/inputs"] == 1


def test_resume_discards_uncommitted_part(tmp_path):
    from memrl.episode.output import TrajectoryWriter

    w = TrajectoryWriter(tmp_path)
    (w.parts_dir / "part-00000.parquet").write_bytes(b"partial")  # crash before its manifest was written
    TrajectoryWriter(tmp_path)
    assert not (w.parts_dir / "part-00000.parquet").exists()


def test_prompt_budget_cuts_are_recorded(policy_and_cfg, tmp_path):
    policy, _, _ = policy_and_cfg
    cfg = _cfg(policy_and_cfg[1].policy.model, tmp_path, "episode.prompt_token_budget=420", "rollout.n=1")
    inputs, _ = load_dataset(cfg.data)
    trajs = build_runner(cfg, policy=policy).run_batch(inputs[:2])
    target = trajs[0].steps[-1]
    assert target.meta.cut_fact_ids, "a tight budget cuts facts"
    assert len(target.prompt_ids) <= 420
    assert set(target.meta.cut_fact_ids).isdisjoint(target.meta.included_fact_ids)
    assert set(target.meta.cut_fact_ids) | set(target.meta.included_fact_ids) == set(
        target.meta.retrieved_ids
    )


def test_passages_fit_the_room_the_prompt_leaves(policy_and_cfg, tmp_path):
    # One long session: adjacent hits join into one passage longer than the whole prompt budget. The memory
    # chooses its passages within the room the prompt leaves (in the policy's tokens), so facts reach the prompt
    # instead of the one oversized passage being cut whole.
    from memrl.types import TurnSpec

    policy, _, _ = policy_and_cfg
    budget = 700
    cfg = _cfg(
        policy_and_cfg[1].policy.model, tmp_path, f"episode.prompt_token_budget={budget}", "rollout.n=1"
    )
    filler = "We talked about the weather, the garden and the neighbours for a while. " * 3
    turns = [
        TurnSpec(
            "history", f"{filler}My cat is called Miso number {i}.", f"s1:{i}", ("user", "assistant")[i % 2]
        )
        for i in range(12)
    ]
    question = "What is my cat called?"
    episode = BatchInput("long", "long", (*turns, TurnSpec("target", question, "Q", "user")), question)
    runner = build_runner(cfg, policy=policy)
    (traj,) = runner.run_batch([episode])
    meta = traj.steps[-1].meta
    assert meta.retrieved_ids and meta.included_fact_ids
    assert len(traj.steps[-1].prompt_ids) <= budget
    joined = sum(len(policy.tokenizer(t.text)["input_ids"]) for t in turns)
    assert joined > budget, "the whole session would not fit: without the room, its passage is cut whole"
