"""The trainer's one path from a batch to training tensors: every ``train.layout`` against the ground truth."""

from __future__ import annotations

import random

import pytest
import torch

from memrl.data.batch import TrajectoryBatchBuilder
from memrl.data.config import BatchConfig
from memrl.train.microbatch import (
    collate_shared,
    forward_logits,
    split_micro_batches,
    token_logprobs,
    unpack,
)
from memrl.types import EpisodeStatus, EpisodeTrajectory, StepTrajectory
from tests.train.train_fixtures import VOCAB, make_episodes, tiny_llama

TRAIN_LAYOUTS = ("shared_prefix", "packed", "padded")


def ragged_episodes() -> list[EpisodeTrajectory]:
    """One-token prompts, empty responses, masked tool tokens, and GRPO groups that share their prompt."""
    rng = random.Random(0)
    steps = []
    for i in range(9):
        p, r = rng.randint(1, 30), rng.randint(0, 12)
        mask = [rng.randint(0, 1) for _ in range(r)]
        steps.append(
            StepTrajectory(
                step_id=f"s{i}",
                prompt_ids=[rng.randint(3, VOCAB - 1) for _ in range(p)],
                response_ids=[rng.randint(3, VOCAB - 1) for _ in range(r)],
                response_mask=mask,
                logprobs=[-0.1 * m for m in mask],
                turn_id=f"t{i}",
            )
        )
    ragged = EpisodeTrajectory(
        episode_id="e", group_id="g", steps=tuple(steps), reward=1.0, status=EpisodeStatus.COMPLETED
    )
    return [ragged, *make_episodes(n_groups=2, n_per_group=4, shared_prompt=True)]


def _alone(model, batch) -> dict[int, torch.Tensor]:
    """Response-token log-probs of each row, run as its own sequence (no padding, no packing, no cache)."""
    out = {}
    for i, rec in enumerate(unpack(batch, torch.ones(batch.num_steps), torch.ones(batch.num_steps))):
        logits = model(input_ids=rec.ids.unsqueeze(0)).logits
        out[i] = token_logprobs(logits, rec.ids.unsqueeze(0))[0, rec.prompt_len :]
    return out


def _per_row(model, batch, layout: str) -> dict[int, torch.Tensor]:
    """Response-token log-probs of each row through the trainer's micro-batches (small budgets: many of them)."""
    # A sequence advantage of 1 marks exactly the response tokens in every layout (loss_mask misses masked ones).
    records = unpack(batch, torch.ones(batch.num_steps), torch.ones(batch.num_steps))
    out = {}
    for mb in split_micro_batches(records, layout, max_tokens=40, max_rows=3):
        logp = token_logprobs(forward_logits(model, mb), mb.input_ids)
        for k, row in enumerate(mb.rows):
            out[row] = logp[(mb.seq_index == k) & (mb.adv != 0)]
    return out


@pytest.mark.parametrize("batch_layout", ["padded", "packed"])
def test_every_train_layout_equals_each_sequence_run_alone(batch_layout):
    model = tiny_llama().eval()
    batch = TrajectoryBatchBuilder(BatchConfig(layout=batch_layout)).build(ragged_episodes())
    with torch.no_grad():
        truth = _alone(model, batch)
        for layout in TRAIN_LAYOUTS:
            got = _per_row(model, batch, layout)
            assert sorted(got) == list(range(batch.num_steps)), layout
            for row, expected in truth.items():
                assert got[row].shape == expected.shape, (layout, row)
                assert torch.allclose(got[row], expected, atol=1e-5), (layout, row)
    assert sum(t.numel() for t in truth.values()) == int(batch.response_lengths.sum())


def test_every_train_layout_gives_the_same_gradient():
    batch = TrajectoryBatchBuilder().build(ragged_episodes())
    grads = {}
    for layout in TRAIN_LAYOUTS:
        model = tiny_llama()
        records = unpack(batch, torch.ones(batch.num_steps), torch.ones(batch.num_steps))
        for mb in split_micro_batches(records, layout, max_tokens=40, max_rows=3):
            (-(token_logprobs(forward_logits(model, mb), mb.input_ids) * mb.loss_mask).sum()).backward()
        grads[layout] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.isfinite(grads["packed"]).all() and grads["packed"].abs().sum() > 0
    for layout in ("shared_prefix", "padded"):
        assert torch.allclose(grads[layout], grads["packed"], atol=1e-5, rtol=1e-4), layout


def test_shared_prefix_micro_batches_are_one_prompt_group_of_at_most_max_rows():
    batch = TrajectoryBatchBuilder().build(make_episodes(n_groups=2, n_per_group=4, shared_prompt=True))
    records = unpack(batch, torch.zeros(batch.num_steps), torch.ones(batch.num_steps))
    micro = split_micro_batches(records, "shared_prefix", max_tokens=10_000, max_rows=3)
    assert [mb.rows for mb in micro] == [[0, 1, 2], [3], [4, 5, 6], [7]]
    for mb in micro:
        prompt_len = records[mb.rows[0]].prompt_len
        assert mb.prefix_ids.shape == (1, prompt_len - 1)  # the prompt minus its last token, once
        assert mb.input_ids.shape[0] == len(mb.rows)


def test_shared_prefix_refuses_rows_with_another_prompt():
    batch = TrajectoryBatchBuilder().build(make_episodes(n_groups=2, n_per_group=1, shared_prompt=True))
    records = unpack(batch, torch.zeros(2), torch.ones(2))
    with pytest.raises(ValueError, match="row 1 has another prompt than row 0"):
        collate_shared(records)
