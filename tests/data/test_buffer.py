from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memrl.data.buffer import (
    BUFFER_SAMPLERS,
    GROUP_FILTERS,
    RolloutBuffer,
    RolloutDumpError,
    dynamic_sampling,
    group_episodes,
    read_rollout_dump,
    select_groups,
)
from memrl.data.config import DataConfig
from memrl.data.datasource import RolloutDataSource
from memrl.registry import RegistryError
from memrl.types import (
    BatchInput,
    EpisodeTrajectory,
    MemoryOp,
    MemoryWrite,
    RollbackRecord,
    StepMeta,
    StepRole,
    StepTrajectory,
    ToolCallRecord,
    TurnRole,
    TurnSpec,
)


def make_inputs(n: int) -> list[BatchInput]:
    return [
        BatchInput(
            episode_id=f"ep{i}",
            group_id=f"ep{i}",
            turns=(TurnSpec(role="target", text=f"q{i}", turn_id=f"t{i}"),),
            final_query=f"q{i}",
        )
        for i in range(n)
    ]


def make_episode(group: str, idx: int, reward: float, status: str = "completed") -> EpisodeTrajectory:
    meta = StepMeta(
        turn_id="t0",
        node_path=(0, 2),
        branch_depth=2,
        tool_calls=(ToolCallRecord(name="python", arguments="1+1", result="2", status="ok", position=3),),
        rollbacks=(
            RollbackRecord(position=5, error="NameError", attempts=2, tokens_removed=4, repaired=True),
        ),
        memory_ops=(MemoryOp(op="ADD", turn_id="h0", fact_ids=(4,), text="Ann is 30"),),
        retrieved_ids=(4, 9),
        extra={"note": "é ü"},
    )
    steps = (
        StepTrajectory(
            step_id=f"{group}/{idx}/0",
            prompt_ids=(1, 2, 3),
            response_ids=(4, 5, 6),
            response_mask=(1, 0, 1),
            logprobs=(-0.25, 0.0, -1.5),
            turn_id="t0",
            meta=meta,
        ),
    )
    return EpisodeTrajectory(
        episode_id=f"{group}-{idx}",
        group_id=group,
        steps=steps,
        reward=reward,
        status=status,
        sample_index=idx,
        failure_reason="boom" if status == "failed" else None,
        metrics={"tools/calls": 1.0},
        step_rewards_ext=(None,),
    )


def test_local_buffer_is_served_before_the_data_source():
    buffer = RolloutBuffer(RolloutDataSource(make_inputs(5), n_samples_per_prompt=2, shuffle=False))
    first = buffer.get_samples(2)
    buffer.add_samples([first[1]])  # e.g. its episodes were aborted: re-run them first
    again = buffer.get_samples(3)
    assert [g[0].group_id for g in again] == ["ep1@e0", "ep2@e0", "ep3@e0"]
    assert again[0] == first[1]
    assert len(buffer) == 0
    assert buffer.metrics["buffer/groups_from_buffer"] == 1
    assert buffer.metrics["buffer/groups_from_source"] == 4


def test_pop_first_is_fifo_and_never_takes_more_than_asked():
    groups = [[x] for x in make_inputs(4)]
    store = list(groups)
    assert BUFFER_SAMPLERS.get("pop_first")(store, 3) == groups[:3]
    assert store == groups[3:]


def test_add_samples_validates_groups():
    buffer = RolloutBuffer(RolloutDataSource(make_inputs(2)))
    with pytest.raises(ValueError, match="group 0"):
        buffer.add_samples([[]])
    with pytest.raises(TypeError, match=r"group 0\[0\]"):
        buffer.add_samples([["not an input"]])
    a, b = make_inputs(2)
    with pytest.raises(ValueError, match="one group_id"):
        buffer.add_samples([[a, b]])


def test_sampler_contract_is_enforced_and_unknown_names_list_choices():
    @BUFFER_SAMPLERS.register("test_peek_without_removing")
    def peek(buffer, num):
        return buffer[:num]

    buffer = RolloutBuffer(RolloutDataSource(make_inputs(3)), sampler="test_peek_without_removing")
    buffer.add_samples([[make_inputs(1)[0]]])
    with pytest.raises(RuntimeError, match="broke its contract"):
        buffer.get_samples(1)
    with pytest.raises(RegistryError, match="dynamic_sampling"):
        RolloutBuffer(RolloutDataSource(make_inputs(3)), group_filter="dynamic")


def test_dynamic_sampling_drops_only_zero_variance_groups():
    mixed = [make_episode("g0", 0, 1.0), make_episode("g0", 1, 0.0)]
    all_right = [make_episode("g1", 0, 1.0), make_episode("g1", 1, 1.0)]
    all_wrong = [make_episode("g2", 0, 0.0), make_episode("g2", 1, 0.0)]
    single = [make_episode("g3", 0, 0.5)]
    result = dynamic_sampling([mixed, all_right, all_wrong, single])
    assert result.kept == [mixed]
    assert [g[0].group_id for g, _ in result.dropped] == ["g1", "g2", "g3"]
    assert all("zero reward variance" in reason for _, reason in result.dropped)
    assert GROUP_FILTERS.get("keep_all")([mixed, all_right]).kept == [mixed, all_right]


def _with_writes(ep: EpisodeTrajectory, credits: list[float]) -> EpisodeTrajectory:
    """``ep`` with memory-write steps of one credit group (a write's alternatives) before its answer."""
    writes = tuple(
        dataclasses.replace(
            ep.steps[0],
            step_id=f"{ep.episode_id}/w0.{j}",
            turn_role=TurnRole.HISTORY,
            meta=dataclasses.replace(
                ep.steps[0].meta,
                turn_role=TurnRole.HISTORY,
                role=StepRole.MEMORY,
                write=MemoryWrite(index=0, alternative=j, alternatives=len(credits), applied=j == 0),
                credit_group=f"{ep.group_id}/memory/0",
            ),
        )
        for j in range(len(credits))
    )
    return dataclasses.replace(
        ep, steps=writes + ep.steps, step_rewards_ext=(*credits, *([None] * len(ep.steps)))
    )


def test_dynamic_sampling_keeps_a_flat_answer_group_whose_write_alternatives_differ():
    flat_answers = [_with_writes(make_episode("g0", 0, 1.0), [0.7, 0.2]), make_episode("g0", 1, 1.0)]
    flat_writes = [_with_writes(make_episode("g1", 0, 1.0), [0.7, 0.7]), make_episode("g1", 1, 1.0)]
    result = dynamic_sampling([flat_answers, flat_writes])
    assert result.kept == [flat_answers]
    assert [g[0].group_id for g, _ in result.dropped] == ["g1"]


def test_filter_groups_counts_and_group_episodes_keeps_order():
    cfg = DataConfig(group_filter="dynamic_sampling")
    buffer = RolloutBuffer.from_config(cfg, RolloutDataSource(make_inputs(2)))
    episodes = [
        make_episode("a", 0, 1.0),
        make_episode("b", 0, 0.0),
        make_episode("a", 1, 0.0),
        make_episode("b", 1, 0.0),
    ]
    groups = group_episodes(episodes)
    assert [[e.episode_id for e in g] for g in groups] == [["a-0", "a-1"], ["b-0", "b-1"]]
    kept = buffer.filter_groups(groups)
    assert [g[0].group_id for g in kept] == ["a"]
    assert buffer.metrics["buffer/groups_kept"] == 1
    assert buffer.metrics["buffer/groups_dropped"] == 1


def test_dump_and_replay_round_trip(tmp_path: Path):
    buffer = RolloutBuffer(RolloutDataSource(make_inputs(2)), dump_dir=tmp_path / "dumps")
    episodes = [make_episode("g", 0, 1.0), make_episode("g", 1, 0.0, status="failed")]
    path = buffer.dump_rollout(7, episodes)
    assert path == tmp_path / "dumps" / "rollout_000007.jsonl"
    assert len(path.read_text(encoding="utf-8").splitlines()) == 2
    assert buffer.load_rollout(7) == episodes
    assert [p.name for p in path.parent.iterdir()] == [path.name]

    assert RolloutBuffer(RolloutDataSource(make_inputs(2))).dump_rollout(1, episodes) is None
    path.write_text(path.read_text(encoding="utf-8") + '{"episode_id": "x"}\n', encoding="utf-8")
    with pytest.raises(RolloutDumpError, match=r"rollout_000007.jsonl:3"):
        read_rollout_dump(path)


def test_buffer_state_round_trip_keeps_pushed_back_groups(tmp_path: Path):
    buffer = RolloutBuffer(RolloutDataSource(make_inputs(4), n_samples_per_prompt=2))
    groups = buffer.get_samples(2)
    buffer.add_samples([groups[0]])
    buffer.save(tmp_path / "buffer.json")
    expected = buffer.get_samples(3)

    resumed = RolloutBuffer(RolloutDataSource(make_inputs(4), n_samples_per_prompt=2))
    resumed.load(tmp_path / "buffer.json")
    assert resumed.get_samples(3) == expected


def _runner_by_reward(rewards: dict[str, list[float]]):
    """Stands in for ``EpisodeRunner.run_batch``: each input becomes one finished episode whose reward is read
    from ``rewards[prompt id][copy number]``; records every batch it ran."""
    batches: list[list[str]] = []

    def run(inputs: list[BatchInput]) -> list[EpisodeTrajectory]:
        batches.append([x.episode_id for x in inputs])
        out = []
        for x in inputs:
            prompt, k = x.episode_id.split("~")
            out.append(
                dataclasses.replace(
                    make_episode(x.group_id, x.sample_index, rewards[prompt][int(k) % len(rewards[prompt])]),
                    episode_id=x.episode_id,
                )
            )
        return out

    return run, batches


def test_rollout_refills_dropped_groups_to_exactly_the_batch_size_and_pushes_back_the_surplus(tmp_path: Path):
    # Two copies per prompt; ep0, ep2, ep4, ep5 agree (no signal); ep1, ep3, ep6, ep7 are mixed.
    signal = {f"ep{i}": [1.0, 0.0] for i in (1, 3, 6, 7)}
    flat = {f"ep{i}": [0.0] for i in (0, 2, 4, 5)}
    source = RolloutDataSource(make_inputs(8), n_samples_per_prompt=2, shuffle=False)
    buffer = RolloutBuffer(source, group_filter="dynamic_sampling", dump_dir=tmp_path)
    run, batches = _runner_by_reward({**signal, **flat})
    result = buffer.rollout(run, 2, rollout_id=1, max_rounds=4)
    # Round 1 drew 2 prompts (ep0 flat, ep1 mixed); keep rate 1/2 → round 2 drew 2 more: ep2 flat, ep3 mixed.
    assert [len(b) for b in batches] == [4, 4]
    assert [g[0].group_id for g in result.groups] == ["ep1@e0", "ep3@e0"]
    assert result.rounds == 2 and len(result.episodes) == 8
    assert sorted(g[0].group_id for g, _ in result.dropped) == ["ep0@e0", "ep2@e0"]
    # The dump holds every round, and select_groups over it gives back exactly what trained.
    dumped = read_rollout_dump(tmp_path / "rollout_000001.jsonl")
    assert dumped == result.episodes
    assert select_groups(buffer.group_filter, dumped, 2).kept == result.groups

    # Next step: ep4 (round 1) is flat; round 2 over-samples by the floor keep rate (4 prompts: ep5 flat, ep6
    # and ep7 mixed, ep0 of the next epoch flat). ep7 is one more than needed: its prompt goes back to the
    # buffer, is served first by the step after, and its first run reaches neither training nor replay.
    result = buffer.rollout(run, 1, rollout_id=2, max_rounds=4)
    assert [len(b) for b in batches[2:]] == [2, 8]
    assert [g[0].group_id for g in result.groups] == ["ep6@e0"]
    assert result.pushed_back == {"ep7@e0"} and len(buffer) == 1
    assert not any(ep.group_id == "ep7@e0" for ep in result.usable)
    result = buffer.rollout(run, 1, rollout_id=3)
    assert batches[-1] == ["ep7~0", "ep7~1"] and [g[0].group_id for g in result.groups] == ["ep7@e0"]
    assert buffer.metrics["buffer/groups_pushed_back"] == 1 and buffer.metrics["buffer/groups_kept"] == 4


def test_rollout_stops_after_max_rounds_with_what_it_found():
    source = RolloutDataSource(make_inputs(4), n_samples_per_prompt=2, shuffle=False)
    buffer = RolloutBuffer(source, group_filter="dynamic_sampling")
    run, batches = _runner_by_reward({f"ep{i}": [0.0] for i in range(4)})
    result = buffer.rollout(run, 2, max_rounds=2)
    assert result.groups == [] and result.rounds == 2
    # Round 2 over-samples by the floor keep rate (4x the missing groups, bounded by 4x).
    assert [len(b) for b in batches] == [4, 16]
    assert len(result.dropped) == 2 + 8
