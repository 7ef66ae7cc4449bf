"""Continuous batching in the HF decode loop: rows beyond ``max_batch_size`` wait and join the running batch as
rows finish (see ``memrl.policy.engine.batching.DecodeLoop``)."""

from __future__ import annotations

import pytest
import torch

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.batching import admissible
from memrl.policy.engine.hf import HFPolicy
from memrl.policy.engine.kv_cache import concat_batches, preallocated_cache
from memrl.testing import random_tiny_llama


@pytest.fixture(scope="module")
def model_tok():
    return random_tiny_llama(seed=3, initializer_range=0.3)


def make_policy(model_tok, limit: int) -> HFPolicy:
    model, tok = model_tok
    policy = HFPolicy.from_model(
        model, tok, PolicyConfig(model="random-peaked", seed=0, max_batch_size=limit)
    )
    policy.eos_ids = []  # every row runs to its own max_tokens: the schedule is known in advance
    return policy


def record_forwards(policy):
    """Rows per model forward, and whether the forward used shared-prefix attention."""
    calls: list[tuple[int, bool]] = []

    def hook(_module, _args, kw):
        calls.append((int(kw["input_ids"].shape[0]), "memrl_shared_prefix" in kw))

    return calls, policy.model.register_forward_pre_hook(hook, with_kwargs=True)


def enc(policy, text: str) -> tuple[int, ...]:
    return tuple(policy.tokenizer.encode(text, add_special_tokens=False))


def test_admission_waits_for_a_quarter_of_the_batch_or_the_whole_queue():
    assert admissible(32, 30, 10) == 0  # 2 free slots of 32: not worth a cache copy yet
    assert admissible(32, 24, 10) == 8  # a quarter free: fill it
    assert admissible(32, 30, 2) == 2  # room for everything that waits
    assert admissible(32, 32, 5) == 0 and admissible(32, 10, 0) == 0
    assert admissible(2, 1, 3) == 1  # tiny batches admit one at a time


def test_finished_rows_slots_go_to_waiting_rows(model_tok):
    policy = make_policy(model_tok, limit=2)
    prompt = enc(policy, "Alice: I moved to Lisbon in May.")
    budgets = [20, 3, 3, 3, 3]
    reqs = [GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=m)) for m in budgets]
    calls, hook = record_forwards(policy)
    try:
        outs = policy.generate(reqs)
    finally:
        hook.remove()
    longest = outs[0][0].token_ids
    assert [len(o[0].token_ids) for o in outs] == budgets
    assert all(o[0].token_ids == longest[: len(o[0].token_ids)] for o in outs)  # greedy: same prefix
    assert max(rows for rows, _ in calls) == 2
    # One prefill of the first two rows, the long row's 19 decode steps, and one prefill per admitted row; the
    # short rows decode beside the long one. Fixed sub-batches would need 1 + 19 + 2 * (1 + 2) = 26 forwards.
    assert len(calls) == 1 + 19 + 3


def test_sampled_rows_equal_their_solo_generation(model_tok):
    policy = make_policy(model_tok, limit=3)
    texts = [
        "Q?",
        "Bob bought a red bike; what colour is it?",
        "chain",
        "Alice: I moved to Lisbon.",
        "x" * 40,
    ]
    reqs = [
        GenerationRequest(
            enc(policy, t), SamplingParams(temperature=1.0, max_tokens=4 + 3 * i, seed=7 + i, top_logprobs=2)
        )
        for i, t in enumerate(texts)
    ]
    together = policy.generate(reqs)
    for req, [out] in zip(reqs, together, strict=True):
        [[alone]] = policy.generate([req])
        assert out.token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(alone.logprobs), atol=1e-4)
    assert len({o[0].token_ids for o in together}) == len(texts)


def test_rows_join_a_batch_decoding_from_a_shared_prefix(model_tok):
    policy = make_policy(model_tok, limit=2)
    prompt = enc(policy, "A shared conversation prefix. " * 3)
    [[first]] = policy.generate([GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=6))])
    cont = prompt + first.token_ids  # its states up to the last token are cached now
    other = enc(policy, "an unrelated prompt")
    reqs = [
        GenerationRequest(cont, SamplingParams(temperature=0.0, max_tokens=12)),
        GenerationRequest(cont, SamplingParams(temperature=0.0, max_tokens=3)),
        GenerationRequest(other, SamplingParams(temperature=0.0, max_tokens=2)),  # waits: shortest budget
    ]
    calls, hook = record_forwards(policy)
    try:
        outs = policy.generate(reqs)
    finally:
        hook.remove()
    shared = [s for _, s in calls]
    # The two continuations start on shared-prefix attention; the third request joins once the short one ends
    # (the merged batch holds every row's own copy).
    assert shared[0] and not shared[-1]
    for req, [out] in zip(reqs, outs, strict=True):
        [[alone]] = policy.generate([GenerationRequest(req.prompt_ids, req.params)])
        assert out.token_ids == alone.token_ids
        assert torch.allclose(torch.tensor(out.logprobs), torch.tensor(alone.logprobs), atol=1e-4)


def filled(rows: int, length: int, value: float, capacity: int | None = None):
    cache = preallocated_cache(1, capacity or length)
    k = torch.full((rows, 2, length, 4), value)
    cache.layers[0].update(k, k + 100)
    return cache


def test_concat_batches_right_aligns_each_part_and_pads_its_mask():
    a, b = filled(1, 3, 1.0), filled(2, 5, 2.0)
    cache, mask = concat_batches(
        [(a, torch.ones(1, 3, dtype=torch.long), None), (b, torch.ones(2, 5, dtype=torch.long), None)], 9
    )
    layer = cache.layers[0]
    assert layer.keys.shape == (3, 2, 5, 4) and layer.capacity == 9
    assert mask.tolist() == [[0, 0, 1, 1, 1], [1] * 5, [1] * 5]
    assert torch.equal(layer.keys[0, :, :2], torch.zeros(2, 2, 4))  # padding: masked, but finite
    assert torch.equal(layer.keys[0, :, 2:], torch.ones(2, 3, 4))
    assert torch.equal(layer.values[1:], torch.full((2, 2, 5, 4), 102.0))
    layer.update(torch.zeros(3, 2, 1, 4), torch.zeros(3, 2, 1, 4))  # decoding continues in place
    assert layer.keys.shape[2] == 6
    # A running batch's finished rows are dropped by the same copy: only the kept rows arrive.
    c = filled(3, 4, 0.0)
    for r in range(3):
        c.layers[0].keys[r] += r
    kept, kmask = concat_batches([(c, torch.ones(3, 4, dtype=torch.long), torch.tensor([2, 0]))], 6)
    assert kept.layers[0].keys[:, 0, 0, 0].tolist() == [2.0, 0.0] and kmask.shape == (2, 4)


def test_concat_batches_drops_columns_no_kept_row_uses():
    # Part a: its one row starts at column 2 of 5; part b's kept row (index 1) starts at column 3 of 6. After
    # right-alignment to 6 columns the first 3 are padding for every kept row, so the merged width is 3.
    a, b = filled(1, 5, 1.0), filled(2, 6, 2.0)
    ma = torch.tensor([[0, 0, 1, 1, 1]])
    mb = torch.tensor([[1] * 6, [0, 0, 0, 1, 1, 1]])
    cache, mask = concat_batches([(a, ma, None), (b, mb, torch.tensor([1]))], 10)
    layer = cache.layers[0]
    assert mask.tolist() == [[1, 1, 1], [1, 1, 1]]
    assert layer.keys.shape == (2, 2, 3, 4) and layer.capacity == 10 - 3  # the room to decode stays the same
    assert torch.equal(layer.keys[0], torch.ones(2, 3, 4)) and torch.equal(
        layer.values[1], torch.full((2, 3, 4), 102.0)
    )


def test_shedding_rows_drops_the_columns_only_they_used(model_tok):
    from memrl.policy.engine.batching import DecodeBatch

    cache = filled(3, 5, 0.0, capacity=8)
    for r in range(3):
        cache.layers[0].keys[r] += r
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 1, 1]])
    batch = DecodeBatch(["r0", "r1", "r2"], torch.zeros(3, 7), mask, torch.zeros(3, 1), cache, padded=True)
    batch.select([1, 2])  # row 0 was the only one reading columns 0-1
    assert batch.rows == ["r1", "r2"] and batch.mask.tolist() == [[1, 1, 1], [0, 1, 1]]
    layer = cache.layers[0]
    assert layer.keys.shape == (2, 2, 3, 4) and layer.keys[:, 0, 0, 0].tolist() == [1.0, 2.0]
    layer.update(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4))  # decoding continues in place
    assert layer.keys.shape[2] == 4 and layer.capacity == 6 and batch.padded
