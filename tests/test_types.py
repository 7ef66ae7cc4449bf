import pytest

from memrl.serialize import batch_input_from_dict, episode_from_dict, step_meta_from_dict, to_dict
from memrl.types import (
    BatchInput,
    BranchFinish,
    ContractError,
    EpisodeStatus,
    EpisodeTrajectory,
    FinishReason,
    GenerationOutput,
    MemoryOp,
    MemoryOpType,
    MemoryWrite,
    PathNode,
    StepMeta,
    StepRole,
    StepTrajectory,
    ToolCallRecord,
    ToolStatus,
    TurnRole,
    TurnSpec,
)


def _turns():
    return (
        TurnSpec(
            role="history", text="Alice: I moved to Lyon.", turn_id="D1:1", speaker="Alice", timestamp="1 May"
        ),
        TurnSpec(role=TurnRole.TARGET, text="Where does Alice live?", turn_id="q0"),
    )


def _step(**kw):
    base = dict(
        step_id="e0/s0",
        prompt_ids=[5, 6, 7],
        response_ids=[8, 9, 10],
        response_mask=[1, 0, 1],
        logprobs=[-0.1, 0.0, -0.2],
        turn_id="q0",
    )
    base.update(kw)
    return StepTrajectory(**base)


def test_turnspec_coerces_role_and_rejects_unknown_role():
    assert _turns()[0].role is TurnRole.HISTORY
    with pytest.raises(ContractError, match=r"TurnSpec.role: expected one of \['history', 'target'\]"):
        TurnSpec(role="assistant", text="x", turn_id="t")


def test_turnspec_rejects_empty_turn_id():
    with pytest.raises(ContractError, match="TurnSpec.turn_id: must be a non-empty string"):
        TurnSpec(role="history", text="x", turn_id=" ")


def test_batch_input_requires_single_final_target():
    bi = BatchInput(
        episode_id="e0", group_id="g0", turns=list(_turns()), final_query="Where does Alice live?"
    )
    assert isinstance(bi.turns, tuple)
    assert bi.target.turn_id == "q0" and len(bi.history) == 1
    hist_only = (_turns()[0],)
    with pytest.raises(ContractError, match="BatchInput.turns: exactly one target turn, last"):
        BatchInput(episode_id="e0", group_id="g0", turns=hist_only, final_query="q")
    reversed_turns = tuple(reversed(_turns()))
    with pytest.raises(ContractError, match=r"target positions \[0\] of 2"):
        BatchInput(episode_id="e0", group_id="g0", turns=reversed_turns, final_query="q")


def test_batch_input_is_frozen():
    bi = BatchInput(episode_id="e0", group_id="g0", turns=_turns(), final_query="q")
    with pytest.raises(AttributeError):
        bi.episode_id = "other"


def test_generation_output_validates_lengths_and_logprobs():
    out = GenerationOutput(
        token_ids=[1, 2], logprobs=[-0.5, -1.0], finish_reason="stop", stop_reason="</python>"
    )
    assert out.finish_reason is FinishReason.STOP
    with pytest.raises(ContractError, match=r"GenerationOutput.logprobs: length 1 != len\(token_ids\) 2"):
        GenerationOutput(token_ids=[1, 2], logprobs=[-0.5], finish_reason="stop")
    with pytest.raises(ContractError, match="is not a log-probability"):
        GenerationOutput(token_ids=[1], logprobs=[0.7], finish_reason="length")
    with pytest.raises(ContractError, match="finish_reason"):
        GenerationOutput(token_ids=[1], logprobs=[-0.1], finish_reason="done")
    with pytest.raises(ContractError, match=r"GenerationOutput.token_ids: item 1 is bool"):
        GenerationOutput(token_ids=[1, True], logprobs=[-0.1, -0.1], finish_reason="stop")
    with pytest.raises(ContractError, match=r"GenerationOutput.token_ids: item 0 is float"):
        GenerationOutput(token_ids=[1.0], logprobs=[-0.1], finish_reason="stop")


def test_step_trajectory_checks_mask_alignment_and_values():
    step = _step()
    assert step.trainable
    with pytest.raises(
        ContractError, match=r"response_mask: length 2 != len\(response_ids\) 3 \(step e0/s0\)"
    ):
        _step(response_mask=[1, 1])
    with pytest.raises(ContractError, match="values must be 0 or 1; position 1 is 2"):
        _step(response_mask=[1, 2, 1])
    assert not _step(response_mask=[0, 0, 0]).trainable
    assert _step(
        turn_role="history"
    ).trainable  # model tokens of a history step: a memory write the policy made


def test_memory_op_rules():
    with pytest.raises(ContractError, match="COMPRESS op must carry the summary id"):
        MemoryOp(op="COMPRESS", turn_id="D1:1")
    with pytest.raises(ContractError, match="UPDATE op must name the fact ids"):
        MemoryOp(op=MemoryOpType.UPDATE, turn_id="D1:1")
    assert MemoryOp(op="ADD", turn_id="D1:1", fact_ids=[3]).fact_ids == (3,)


def test_failed_episode_needs_reason_and_ext_rewards_align():
    with pytest.raises(ContractError, match="FAILED episode must say why"):
        EpisodeTrajectory(episode_id="e", group_id="g", steps=(), reward=0.0, status="failed")
    with pytest.raises(ContractError, match="step_rewards_ext: length 2 != number of steps 1"):
        EpisodeTrajectory(
            episode_id="e",
            group_id="g",
            steps=(_step(),),
            reward=1.0,
            status="completed",
            step_rewards_ext=(0.0, 0.0),
        )


def test_dict_round_trip_of_nested_contracts():
    meta = StepMeta(
        turn_id="q0",
        tree_id="t0",
        node_path=(0, 2),
        branch_depth=1,
        tool_calls=(
            ToolCallRecord(name="python", arguments="print(1)", result="1", status="ok", position=4),
        ),
        memory_ops=(MemoryOp(op="RETRIEVE", turn_id="q0", fact_ids=(1, 2), scores=(0.9, 0.5)),),
    )
    ep = EpisodeTrajectory(
        episode_id="e", group_id="g", steps=(_step(meta=meta),), reward=1.0, status=EpisodeStatus.COMPLETED
    )
    d = to_dict(ep)
    assert d["status"] == "completed" and d["steps"][0]["meta"]["memory_ops"][0]["op"] == "RETRIEVE"
    assert episode_from_dict(d) == ep
    bi = BatchInput(episode_id="e0", group_id="g0", turns=_turns(), final_query="q", metadata={"category": 2})
    assert batch_input_from_dict(to_dict(bi)) == bi
    with pytest.raises(ContractError, match="unknown fields"):
        batch_input_from_dict({**to_dict(bi), "bogus": 1})


def test_step_meta_dicts_written_before_the_typed_fields_still_load():
    """Dumps and replay checkpoints of older versions kept these fields in ``extra``."""
    old = to_dict(StepMeta(turn_id="q0", extra={"question": "Where?"}))
    for name in (
        "tree_path",
        "finish",
        "leaf_index",
        "source_episode_id",
        "response_text",
        "included_fact_ids",
        "gold_answer",
    ):
        del old[name]
    old["extra"].update(
        tree_path=[{"uid": "root", "pos": 0, "entropy": 0.5, "children": 2}, {"uid": "a", "pos": 7}],
        finish="length",
        leaf_index=2,
        source_episode_id="ep-1",
        response_text="<answer>Oslo</answer>",
        included_fact_ids=[3, 4],
        gold_answer="Oslo",
    )
    meta = step_meta_from_dict(old)
    assert meta.tree_path == (PathNode("root", 0, 0.5, 2), PathNode("a", 7))
    assert meta.finish is BranchFinish.LENGTH and meta.leaf_index == 2 and meta.source_episode_id == "ep-1"
    assert meta.response_text == "<answer>Oslo</answer>" and meta.included_fact_ids == (3, 4)
    assert meta.gold_answer == "Oslo"
    assert meta.extra == {"question": "Where?"}
    assert step_meta_from_dict(to_dict(meta)) == meta


def test_tool_status_is_an_enum_that_reads_as_its_value():
    rec = ToolCallRecord(name="python", arguments="x", result="", status="timeout", position=0)
    assert rec.status is ToolStatus.TIMEOUT and f"{rec.status}" == "timeout" and rec.status == "timeout"
    with pytest.raises(
        ContractError, match=r"ToolCallRecord.status: expected one of \['ok', 'error', 'timeout'\]"
    ):
        ToolCallRecord(name="python", arguments="x", result="", status="crashed", position=0)


def _memory_meta(**kw) -> StepMeta:
    return StepMeta(turn_id="D1:2", turn_role=TurnRole.HISTORY, role="memory", **kw)


def test_role_is_answer_on_target_steps_and_typed_on_memory_writes():
    assert StepMeta(turn_id="q0").role is StepRole.ANSWER
    assert StepMeta(turn_id="D1:1", turn_role=TurnRole.HISTORY).role is None  # an untrainable history record
    meta = _memory_meta(
        write=MemoryWrite(index=2, alternative=1, alternatives=3, applied=False), credit_group="g/m/2"
    )
    assert meta.role is StepRole.MEMORY and meta.role == "memory" and meta.write.index == 2
    with pytest.raises(ContractError, match="StepMeta.role: memory steps have turn_role history, got target"):
        StepMeta(turn_id="q0", role="memory", write=MemoryWrite(index=0))
    with pytest.raises(ContractError, match=r"StepMeta.role: expected one of \['answer', 'memory'\]"):
        StepMeta(turn_id="D1:1", turn_role=TurnRole.HISTORY, role="writer")
    with pytest.raises(ContractError, match="StepMeta.write: a memory step carries its MemoryWrite"):
        _memory_meta()
    with pytest.raises(ContractError, match="StepMeta.credit_group: only memory steps"):
        StepMeta(turn_id="q0", credit_group="g")
    with pytest.raises(ContractError, match="StepMeta.credit_group: must be a non-empty string"):
        _memory_meta(write=MemoryWrite(index=0), credit_group=" ")


def test_memory_write_validates_its_fields():
    w = MemoryWrite(index=0, op_score=1, format_errors=["line 2: unknown id 9"])
    assert w.op_score == 1.0 and w.op_right is True and w.format_errors == ("line 2: unknown id 9",)
    assert MemoryWrite(index=0).op_right is None and MemoryWrite(index=0, op_score=0.5).op_right is False
    for kw, msg in [
        ({"index": -1}, "MemoryWrite.index: expected an int >= 0"),
        (
            {"index": 0, "alternative": 3, "alternatives": 3},
            "MemoryWrite.alternative: 3 is not below alternatives=3",
        ),
        ({"index": 0, "alternatives": 0}, "MemoryWrite.alternatives: expected an int >= 1"),
        ({"index": 0, "op_score": 1.5}, r"MemoryWrite.op_score: expected None or a number in \[0.0, 1.0\]"),
        ({"index": 0, "applied": 1}, "MemoryWrite.applied: expected bool"),
        ({"index": 0, "snapshot_reward": "high"}, "MemoryWrite.snapshot_reward"),
    ]:
        with pytest.raises(ContractError, match=msg):
            MemoryWrite(**kw)


def test_memory_steps_round_trip_and_older_dumps_of_them_load():
    write = MemoryWrite(
        index=1, turns_read=12, facts_after=5, op_score=0.5, gold_ops="NOOP", snapshot_reward=0.25
    )
    meta = _memory_meta(write=write, credit_group="g/memory", extra={"read_turns": ["[x] A: hi"]})
    d = to_dict(meta)
    assert d["role"] == "memory" and d["write"]["turns_read"] == 12
    assert step_meta_from_dict(d) == meta
    # Written when the write's fields lived in ``extra`` (op_right before op_score existed).
    old = to_dict(StepMeta(turn_id="D1:2", turn_role=TurnRole.HISTORY))
    for name in ("role", "credit_group", "write"):
        del old[name]
    old["extra"] = {
        "role": "memory", "credit_group": "g/memory/1", "write_index": 1, "alternative": 0, "alternatives": 2,
        "applied": True, "format_errors": [], "op_right": False, "gold_ops": "ADD x", "facts_after": 3,
        "turns_read": 6, "credit": 0.7, "read_turns": ["[x] A: hi"],
    }  # fmt: skip
    got = step_meta_from_dict(old)
    assert got.role is StepRole.MEMORY and got.credit_group == "g/memory/1"
    assert got.write == MemoryWrite(
        index=1, alternatives=2, op_score=0.0, gold_ops="ADD x", facts_after=3, turns_read=6
    )
    assert got.extra == {"read_turns": ["[x] A: hi"]}  # display-only values stay; the typed ones moved out
