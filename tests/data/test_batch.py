from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from memrl.data.batch import (
    BatchError,
    TrajectoryBatchBuilder,
    select_steps,
    unpack_steps,
    validate_batch,
)
from memrl.data.config import BatchConfig
from memrl.types import EpisodeTrajectory, StepMeta, StepTrajectory


def step(sid, prompt, response, mask=None, role="target", lps=None):
    mask = mask if mask is not None else [1] * len(response)
    return StepTrajectory(
        step_id=sid,
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        logprobs=lps if lps is not None else [-0.5 * m for m in mask],
        turn_id=sid,
        turn_role=role,
        meta=StepMeta(turn_id=sid, turn_role=role, branch_depth=len(sid)),
    )


def episode(eid, steps, reward=1.0, status="completed", group="g", ext=()):
    return EpisodeTrajectory(
        episode_id=eid, group_id=group, steps=tuple(steps), reward=reward, status=status, step_rewards_ext=ext
    )


def sample_episodes():
    return [
        episode(
            "e0",
            [
                step("h", [9, 9], [8], role="history"),
                step("a", [1, 2, 3], [4, 5, 6], mask=[1, 1, 0]),
                step("b", [7], [8, 9]),
            ],
            reward=2.0,
            group="g0",
        ),
        episode("e1", [step("c", [5, 6], [7])], reward=-1.0, group="g0", ext=(0.25,)),
    ]


def test_padded_layout_matches_verl_conventions():
    batch = TrajectoryBatchBuilder(BatchConfig(layout="padded")).build(sample_episodes())
    assert batch.step_ids == ["a", "b", "c"]  # the history step is dropped
    assert batch.episode_ids == ["e0", "e0", "e1"] and batch.group_ids == ["g0"] * 3
    assert [m.turn_id for m in batch.step_meta] == ["a", "b", "c"]  # sidecar aligned 1:1
    assert batch.step_rewards_ext == [None, None, 0.25]
    assert batch.prompts.tolist() == [[1, 2, 3], [0, 0, 7], [0, 5, 6]]  # left-padded
    assert batch.responses.tolist() == [[4, 5, 6], [8, 9, 0], [7, 0, 0]]  # right-padded
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 6], [0, 0, 7, 8, 9, 0], [0, 5, 6, 7, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 6, [0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 2], [0, 0, 1, 2, 2, 2]]
    assert batch.response_mask.tolist() == [[1, 1, 0], [1, 1, 0], [1, 0, 0]]
    # outcome reward on the last response token with mask 1; episode reward broadcast to its target steps
    assert batch.token_level_rewards.tolist() == [[0, 2, 0], [0, 2, 0], [-1, 0, 0]]
    assert batch.rewards.tolist() == [2.0, 2.0, -1.0]
    assert batch.old_log_probs.tolist() == [[-0.5, -0.5, 0], [-0.5, -0.5, 0], [-0.5, 0, 0]]
    assert batch.prompt_lengths.tolist() == [3, 1, 2] and batch.response_lengths.tolist() == [3, 2, 1]
    assert batch.truncated.tolist() == [False, False, False]


def test_packed_layout_has_no_padding_and_restarting_positions():
    batch = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(sample_episodes())
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.cu_seqlens.tolist() == [0, 6, 9, 12]
    assert batch.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9, 5, 6, 7]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1, 2]]
    assert batch.response_mask.tolist() == [[0, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1]]
    assert batch.token_level_rewards.tolist() == [[0, 0, 0, 0, 2, 0, 0, 0, 2, 0, 0, -1]]
    assert batch.attention_mask.sum() == 12 and batch.prompts is None


def test_untrained_steps_can_be_kept_masked():
    batch = TrajectoryBatchBuilder(BatchConfig(untrained_steps="mask")).build(sample_episodes())
    assert batch.step_ids == ["h", "a", "b", "c"]
    assert batch.response_mask[0].tolist() == [0, 0, 0]  # never trained
    assert batch.token_level_rewards[0].abs().sum() == 0 and batch.rewards[0] == 0


def test_unfinished_or_empty_inputs_raise():
    builder = TrajectoryBatchBuilder()
    with pytest.raises(BatchError, match="'e9' is aborted"):
        builder.build([episode("e9", [step("x", [1], [2])], status="aborted")])
    with pytest.raises(BatchError, match="no rows"):
        builder.build([episode("e9", [step("x", [1], [2], role="history")])])


def test_length_limits_raise_or_truncate_visibly():
    eps = [
        episode("e0", [step("long", [1, 2, 3, 4, 5], [6, 7, 8, 9])]),
        episode("e1", [step("ok", [1], [2])]),
    ]
    strict = TrajectoryBatchBuilder(BatchConfig(max_prompt_len=3, max_response_len=2))
    with pytest.raises(BatchError, match="step 'long'.*on_overflow=truncate"):
        strict.build(eps)
    cut = TrajectoryBatchBuilder(
        BatchConfig(max_prompt_len=3, max_response_len=2, on_overflow="truncate", layout="packed")
    ).build(eps)
    rows = unpack_steps(cut)
    assert rows[0].prompt_ids == (3, 4, 5) and rows[0].response_ids == (6, 7)  # prompt keeps its tail
    assert cut.truncated.tolist() == [True, False]
    status = TrajectoryBatchBuilder().build([episode("e2", [step("t", [1], [2])], status="truncated")])
    assert status.truncated.tolist() == [True]


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_validate_batch_names_the_offending_step(layout):
    batch = TrajectoryBatchBuilder(BatchConfig(layout=layout)).build(sample_episodes())
    validate_batch(batch)
    if layout == "padded":
        batch.response_mask[1, 2] = 1  # past step b's response length 2
    else:
        batch.response_mask[0, 6] = 1  # the prompt token of step b
    with pytest.raises(BatchError, match="step 'b'"):
        validate_batch(batch)


def test_select_keeps_rows_in_the_asked_order_and_layout():
    batch = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(sample_episodes())
    padded = select_steps(batch, [2, 0], layout="padded")
    assert padded.layout == "padded"
    rows = unpack_steps(batch)
    assert padded.step_ids == ["c", "a"] and unpack_steps(padded) == [rows[2], rows[0]]
    assert padded.rewards.tolist() == [batch.rewards[2].item(), batch.rewards[0].item()]
    part = select_steps(batch, [1, 2])
    assert part.layout == "packed" and part.step_ids == ["b", "c"]
    assert part.input_ids.shape[1] == int(batch.cu_seqlens[3] - batch.cu_seqlens[1])


# -- property: packing then unpacking is the identity ----------------------------------------------------------

token = st.integers(0, 383)


@st.composite
def steps_strategy(draw, sid):
    prompt = draw(st.lists(token, min_size=1, max_size=12))
    response = draw(st.lists(token, min_size=0, max_size=12))
    mask = draw(st.lists(st.integers(0, 1), min_size=len(response), max_size=len(response)))
    # multiples of 1/64 are exact in float32, so logprobs survive the tensor round trip bit-for-bit
    lps = [-draw(st.integers(0, 640)) / 64 * m for m in mask]
    role = draw(st.sampled_from(["target", "target", "history"]))
    return step(sid, prompt, response, mask, role=role, lps=lps)


@st.composite
def episodes_strategy(draw):
    out = []
    for e in range(draw(st.integers(1, 4))):
        steps = [draw(steps_strategy(f"e{e}s{k}")) for k in range(draw(st.integers(1, 4)))]
        if all(s.turn_role.value == "history" for s in steps):  # the builder needs >= 1 target row
            steps.append(step(f"e{e}t", [1], [2]))
        reward = draw(st.sampled_from([0.0, 1.0, -0.5]))
        out.append(episode(f"e{e}", steps, reward=reward, group=f"g{e % 2}"))
    return out


@settings(max_examples=50, deadline=None)
@given(eps=episodes_strategy(), layout=st.sampled_from(["padded", "packed"]))
def test_pack_then_unpack_is_identity(eps, layout):
    batch = TrajectoryBatchBuilder(BatchConfig(layout=layout)).build(eps)
    expected = [
        (s.step_id, s.prompt_ids, s.response_ids, s.response_mask, s.logprobs)
        for e in eps
        for s in e.steps
        if s.turn_role.value == "target"
    ]
    assert [tuple(u) for u in unpack_steps(batch)] == expected
    other = "packed" if layout == "padded" else "padded"
    assert unpack_steps(select_steps(batch, range(batch.num_steps), layout=other)) == unpack_steps(batch)
    # every target row carries its episode reward, on at most one token
    rewards = {e.episode_id: e.reward for e in eps}
    assert batch.rewards.tolist() == [rewards[x] for x in batch.episode_ids]
    assert torch.allclose(batch.token_level_rewards.sum(-1).sum(), (batch.rewards * _has_mask(batch)).sum())


def _has_mask(batch) -> torch.Tensor:
    return torch.tensor([any(u.response_mask) for u in unpack_steps(batch)], dtype=torch.float32)
