from __future__ import annotations

import random

import pytest
import torch

from memrl.data.batch import TrajectoryBatchBuilder
from memrl.data.config import BatchConfig
from memrl.data.packing import (
    block_causal_mask,
    packed_forward_logprobs,
    padded_forward_logprobs,
    plan_bins,
)
from memrl.types import EpisodeTrajectory, StepTrajectory

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=384,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return transformers.LlamaForCausalLM(config).float()


@pytest.fixture(scope="module")
def episodes():
    rng = random.Random(0)
    steps = []
    for i in range(9):
        p, r = rng.randint(1, 30), rng.randint(0, 12)
        mask = [rng.randint(0, 1) for _ in range(r)]
        steps.append(
            StepTrajectory(
                step_id=f"s{i}",
                prompt_ids=[rng.randint(3, 383) for _ in range(p)],
                response_ids=[rng.randint(3, 383) for _ in range(r)],
                response_mask=mask,
                logprobs=[-0.1 * m for m in mask],
                turn_id=f"t{i}",
            )
        )
    return [
        EpisodeTrajectory(episode_id="e", group_id="g", steps=tuple(steps), reward=1.0, status="completed")
    ]


def test_plan_bins_respects_capacity_and_uses_every_sequence_once():
    lengths = [5, 9, 1, 7, 3, 3, 10, 2]
    bins = plan_bins(lengths, capacity=10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 10 for b in bins)
    assert len(bins) == 4  # 40 tokens in bins of 10: first-fit decreasing is optimal here
    with pytest.raises(ValueError, match="sequence 6 has 10 tokens > bin capacity 9"):
        plan_bins(lengths, capacity=9)


def test_block_causal_mask_never_crosses_segments():
    seg = torch.tensor([[0, 0, 1, 1, 1, -6]])
    allowed = block_causal_mask(seg, torch.float32)[0, 0] == 0
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [0, 0, 1, 0, 0, 0],
            [0, 0, 1, 1, 0, 0],
            [0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)


def _reference_logprobs(model, batch) -> torch.Tensor:
    """Each sequence on its own, no padding, no packing: the ground truth."""
    out = []
    cu = batch.cu_seqlens.tolist()
    for i in range(batch.num_steps):
        ids = batch.input_ids[:, cu[i] : cu[i + 1]]
        logits = model(input_ids=ids).logits
        lp = torch.log_softmax(logits[0, :-1], -1).gather(-1, ids[0, 1:, None])[:, 0]
        out.append(torch.cat([torch.zeros(1), lp]))
    return torch.cat(out).unsqueeze(0)


def test_packed_and_padded_forwards_match_unpacked_reference(tiny_llama, episodes):
    packed = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(episodes)
    padded = TrajectoryBatchBuilder(BatchConfig(layout="padded")).build(episodes)
    with torch.no_grad():
        ref = _reference_logprobs(tiny_llama, packed)
        lp_packed = packed_forward_logprobs(tiny_llama, packed, bin_capacity=40, bins_per_forward=2)
        lp_padded = padded_forward_logprobs(tiny_llama, padded)
    assert lp_packed.shape == packed.input_ids.shape
    assert torch.allclose(lp_packed, ref, atol=1e-5)
    # padded response log-probs are the packed ones at the response positions
    cu, plen = packed.cu_seqlens.tolist(), packed.prompt_lengths.tolist()
    response_positions = [t for i in range(packed.num_steps) for t in range(cu[i] + plen[i], cu[i + 1])]
    resp_from_packed = lp_packed[0, response_positions]
    got = torch.cat([lp_padded[i, : int(n)] for i, n in enumerate(padded.response_lengths)])
    assert torch.allclose(got, resp_from_packed, atol=1e-5)
    assert torch.isfinite(lp_padded).all()


def test_packed_forward_is_differentiable(tiny_llama, episodes):
    packed = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(episodes)
    tiny_llama.zero_grad(set_to_none=True)
    loss = -(packed_forward_logprobs(tiny_llama, packed) * packed.response_mask).sum()
    loss.backward()
    grads = [p.grad for p in tiny_llama.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)
    with pytest.raises(ValueError, match="packed batch"):
        packed_forward_logprobs(tiny_llama, TrajectoryBatchBuilder().build(episodes))
