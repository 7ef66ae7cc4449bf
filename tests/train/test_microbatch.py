"""The trainer's one path from a batch to training tensors (shared-prefix micro-batches) against the ground truth
(each sequence run alone) and the padded reference without prefix sharing."""

from __future__ import annotations

import random

import pytest
import torch

from memrl.data.batch import TrajectoryBatchBuilder
from memrl.data.config import BatchConfig
from memrl.train.microbatch import (
    PROMPT_CHECKPOINT_ATTR,
    SeqRecord,
    checkpointed_layers,
    collate,
    collate_common,
    collate_shared,
    forward_logits,
    seq_records,
    split_micro_batches,
    token_logprobs,
)
from memrl.types import EpisodeStatus, EpisodeTrajectory, StepTrajectory
from tests.train.train_fixtures import VOCAB, make_episodes, tiny_llama

PATHS = ("shared_prefix", "padded")
MAX_ROWS = 3


def _micro(records, path: str):
    """The trainer's micro-batches, or the padded reference: ``MAX_ROWS`` consecutive whole sequences each."""
    if path == "shared_prefix":
        return split_micro_batches(records, max_rows=MAX_ROWS)
    return [collate(records[i : i + MAX_ROWS]) for i in range(0, len(records), MAX_ROWS)]


def _step(step_id: str, prompt: list[int], response: list[int]) -> StepTrajectory:
    mask = [1] * len(response)
    return StepTrajectory(
        step_id=step_id,
        prompt_ids=prompt,
        response_ids=response,
        response_mask=mask,
        logprobs=[-0.1] * len(response),
        turn_id=step_id,
    )


def _episode(episode_id: str, group_id: str, *steps: StepTrajectory) -> EpisodeTrajectory:
    return EpisodeTrajectory(
        episode_id=episode_id, group_id=group_id, steps=steps, reward=1.0, status=EpisodeStatus.COMPLETED
    )


def ragged_episodes() -> list[EpisodeTrajectory]:
    """One-token prompts (alone and shared by a group), empty responses, masked tool tokens, and GRPO groups that
    share their prompt."""
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
    # Groups of one whose prompt is a single token (nothing to share), one of them with no response at all.
    steps += [_step("one", [5], [6, 7, 8]), _step("bare", [4], [])]
    one_token_group = [_episode(f"o{k}", "o", _step(f"o{k}", [9], [10 + k] * (k + 1))) for k in range(3)]
    return [
        _episode("e", "g", *steps),
        *one_token_group,
        *make_episodes(n_groups=2, n_per_group=4, shared_prompt=True),
    ]


def _alone(model, batch) -> dict[int, torch.Tensor]:
    """Response-token log-probs of each row, run as its own sequence (no padding, no packing, no cache)."""
    out = {}
    for i, rec in enumerate(seq_records(batch, torch.ones(batch.num_steps), torch.ones(batch.num_steps))):
        logits = model(input_ids=rec.ids.unsqueeze(0)).logits
        out[i] = token_logprobs(logits, rec.ids.unsqueeze(0))[0, rec.prompt_len :]
    return out


def _per_row(model, batch, path: str) -> dict[int, torch.Tensor]:
    """Response-token log-probs of each row through ``path``'s micro-batches (small ones: many of them)."""
    # A sequence advantage of 1 marks exactly the response tokens on both paths (loss_mask misses masked ones).
    records = seq_records(batch, torch.ones(batch.num_steps), torch.ones(batch.num_steps))
    out = {}
    for mb in _micro(records, path):
        logp = token_logprobs(forward_logits(model, mb), mb.input_ids)
        for k, row in enumerate(mb.rows):
            out[row] = logp[(mb.seq_index == k) & (mb.adv != 0)]
    return out


@pytest.mark.parametrize("batch_layout", ["padded", "packed"])
def test_shared_prefix_and_padded_reference_equal_each_sequence_run_alone(batch_layout):
    model = tiny_llama().eval()
    batch = TrajectoryBatchBuilder(BatchConfig(layout=batch_layout)).build(ragged_episodes())
    with torch.no_grad():
        truth = _alone(model, batch)
        for path in PATHS:
            got = _per_row(model, batch, path)
            assert sorted(got) == list(range(batch.num_steps)), path
            for row, expected in truth.items():
                assert got[row].shape == expected.shape, (path, row)
                assert torch.allclose(got[row], expected, atol=1e-5), (path, row)
    assert sum(t.numel() for t in truth.values()) == int(batch.response_lengths.sum())


def test_shared_prefix_gives_the_padded_reference_gradient():
    batch = TrajectoryBatchBuilder().build(ragged_episodes())
    grads = {}
    for path in PATHS:
        model = tiny_llama()
        records = seq_records(batch, torch.ones(batch.num_steps), torch.ones(batch.num_steps))
        for mb in _micro(records, path):
            (-(token_logprobs(forward_logits(model, mb), mb.input_ids) * mb.loss_mask).sum()).backward()
        grads[path] = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert torch.isfinite(grads["padded"]).all() and grads["padded"].abs().sum() > 0
    assert torch.allclose(grads["shared_prefix"], grads["padded"], atol=1e-5, rtol=1e-4)


def _shared_prefix_pass(model, records) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Log-probs, gradient and the bytes autograd saved for backward over the records' shared-prefix micro-batches."""
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    logps = []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for mb in split_micro_batches(records, 8):
            logp = token_logprobs(forward_logits(model, mb), mb.input_ids)
            logps.append(logp.detach().flatten())
            (-(logp * mb.loss_mask).sum()).backward()
    return torch.cat(logps), torch.cat([p.grad.flatten() for p in model.parameters()]), saved[0]


def test_a_long_prompt_is_checkpointed_layer_by_layer_with_the_same_gradient_and_less_kept():
    prompt = [random.Random(5).randrange(3, VOCAB) for _ in range(96)]
    episodes = [_episode(f"e{i}", "g", _step(f"s{i}", prompt, [5 + i, 6, 7 + i])) for i in range(3)]
    batch = TrajectoryBatchBuilder().build(episodes)
    records = seq_records(batch, torch.ones(batch.num_steps), torch.ones(batch.num_steps))
    plain = _shared_prefix_pass(tiny_llama(), records)
    model = tiny_llama()
    setattr(model, PROMPT_CHECKPOINT_ATTR, 64)  # the 95-token shared prefix is long enough
    checked = _shared_prefix_pass(model, records)
    assert torch.allclose(checked[0], plain[0], atol=1e-6)
    assert plain[1].abs().sum() > 0 and torch.allclose(checked[1], plain[1], atol=1e-6, rtol=1e-5)
    assert checked[2] < plain[2] / 2  # the prompt's activations are recomputed, not kept
    assert all("forward" not in vars(m) for m in model.modules())  # the layers' own forward is back
    setattr(model, PROMPT_CHECKPOINT_ATTR, 200)  # now shorter than the threshold: forwarded as before
    assert _shared_prefix_pass(model, records)[2] == plain[2]


def test_checkpointing_refuses_a_model_without_decoder_layers():
    with pytest.raises(TypeError, match="no decoder layers"), checkpointed_layers(torch.nn.Linear(2, 2)):
        pass


def test_one_token_prompts_and_groups_of_one_get_micro_batches_of_their_own():
    batch = TrajectoryBatchBuilder().build(ragged_episodes())
    records = seq_records(batch, torch.ones(batch.num_steps), torch.ones(batch.num_steps))
    micro = split_micro_batches(records, max_rows=MAX_ROWS)
    by_step = {batch.step_ids[mb.rows[0]]: mb for mb in micro}
    # The ragged episode's 11 steps all have other prompts than their neighbours: 11 groups of one.
    assert [len(mb.rows) for mb in micro[:11]] == [1] * 11
    assert by_step["one"].prefix_ids.shape == (1, 0) and by_step["one"].input_ids.tolist() == [[5, 6, 7, 8]]
    assert by_step["bare"].prefix_ids.shape == (1, 0) and by_step["bare"].input_ids.tolist() == [[4]]
    group = by_step["o0"]  # three rows after the same one-token prompt: one micro-batch, nothing to share
    assert [batch.step_ids[r] for r in group.rows] == ["o0", "o1", "o2"] and group.prefix_ids.shape == (1, 0)
    assert group.input_ids.tolist() == [[9, 10, 0, 0], [9, 11, 11, 0], [9, 12, 12, 12]]


def test_shared_prefix_micro_batches_are_one_prompt_group_of_at_most_max_rows():
    batch = TrajectoryBatchBuilder().build(make_episodes(n_groups=2, n_per_group=4, shared_prompt=True))
    records = seq_records(batch, torch.zeros(batch.num_steps), torch.ones(batch.num_steps))
    micro = split_micro_batches(records, max_rows=3)
    assert [mb.rows for mb in micro] == [[0, 1, 2], [3], [4, 5, 6], [7]]
    for mb in micro:
        prompt_len = records[mb.rows[0]].prompt_len
        assert mb.prefix_ids.shape == (1, prompt_len - 1)  # the prompt minus its last token, once
        assert mb.input_ids.shape[0] == len(mb.rows)


def test_shared_prefix_refuses_rows_with_another_prompt():
    batch = TrajectoryBatchBuilder().build(make_episodes(n_groups=2, n_per_group=1, shared_prompt=True))
    records = seq_records(batch, torch.zeros(2), torch.ones(2))
    with pytest.raises(ValueError, match="row 1 has another prompt than row 0"):
        collate_shared(records)


def _common_prefix_records():
    """Prompts that start alike (shared instructions) and then differ, ragged responses; one prompt is a prefix
    of another, so the common part stops at the shorter prompt minus its last token."""
    rng = random.Random(5)
    head = [rng.randrange(3, VOCAB) for _ in range(9)]
    out = []
    for i, (extra, resp) in enumerate([(4, 3), (7, 5), (0, 2), (5, 6)]):
        ids = (
            head
            + [rng.randrange(3, VOCAB) for _ in range(extra)]
            + [rng.randrange(3, VOCAB) for _ in range(resp)]
        )
        pl = len(head) + extra
        zeros, ones = torch.zeros(pl), torch.ones(resp)
        out.append(SeqRecord(torch.tensor(ids), pl, torch.cat([zeros, ones]), torch.zeros(len(ids)),
                             torch.cat([zeros, ones]), i))  # fmt: skip
    return out


def test_a_common_prompt_prefix_is_forwarded_once_with_the_padded_logprobs_and_gradient():
    records = _common_prefix_records()
    mb = collate_common(records)
    assert mb.prefix_ids.shape == (1, 8)  # the shortest prompt (9 tokens) minus its last token
    results = {}
    for name, batch in (("common", mb), ("padded", collate(records))):
        model = tiny_llama()
        logp = token_logprobs(forward_logits(model, batch), batch.input_ids)
        (-(logp * batch.loss_mask).sum()).backward()
        rows = [logp[(batch.seq_index == k) & (batch.loss_mask > 0)].detach() for k in range(len(records))]
        results[name] = (rows, torch.cat([p.grad.flatten() for p in model.parameters()]))
    for got, ref in zip(results["common"][0], results["padded"][0], strict=True):
        assert got.shape == ref.shape and torch.allclose(got, ref, atol=1e-5)
    assert torch.allclose(results["common"][1], results["padded"][1], atol=1e-5, rtol=1e-4)
    lone = collate_common(records[:1] + [SeqRecord(torch.tensor([7, 8, 9]), 2, *[torch.zeros(3)] * 3, 9)])
    assert lone.prefix_ids is None  # nothing in common: plain padded rows


def test_the_output_layer_skips_prompt_positions_no_loss_reads():
    """Rows that carry prompt tokens (whole rows, common-prefix tails) get logits only from the position before
    the earliest response token on; the log-probs there are those of the full forward."""
    # prompts of 13, 16 and 14 tokens whose first 9 agree (the one of 9 tokens would leave no prompt tail)
    records = [r for r in _common_prefix_records() if r.prompt_len > 9]
    model = tiny_llama().eval()
    for mb in (collate(records), collate_common(records)):
        width = mb.input_ids.shape[1]
        with torch.no_grad():
            logits = forward_logits(model, mb)
            full = model(
                input_ids=mb.input_ids, attention_mask=mb.attention_mask, position_ids=mb.position_ids
            )
        assert mb.scored_from == min(r.prompt_len for r in records) - (
            mb.prefix_ids.shape[1] if mb.prefix_ids is not None else 0
        )
        assert logits.shape[1] == width - mb.scored_from + 1 < width
        if mb.prefix_ids is None:
            ref = token_logprobs(full.logits.float(), mb.input_ids)
            got = token_logprobs(logits, mb.input_ids)
            assert torch.allclose(got[:, mb.scored_from :], ref[:, mb.scored_from :], atol=1e-5)
            assert (got[:, : mb.scored_from] == 0).all()


def test_a_shared_prompt_reaches_the_output_layer_at_one_position_only():
    """The prompt forwarded once for its group (its KV cache) needs no logits but its last: over a long prompt
    the output layer's logits are gigabytes (a 7.9 K-token LoCoMo prompt: 1.5 GB) that no loss reads."""
    records = [r for r in _common_prefix_records() if r.prompt_len > 9]
    mb = collate_common(records)
    assert mb.prefix_ids is not None and mb.prefix_ids.shape[1] >= 9
    model = tiny_llama().eval()
    positions = []
    hook = model.lm_head.register_forward_hook(lambda _m, inp, _out: positions.append(inp[0].shape[1]))
    try:
        with torch.no_grad():
            logits = forward_logits(model, mb)
    finally:
        hook.remove()
    width = mb.input_ids.shape[1]
    assert positions == [1, width - mb.scored_from + 1]  # the prefix's last position, then the scored block
    assert logits.shape[1] == positions[-1]


def test_rows_of_distinct_prompts_that_start_alike_share_one_micro_batch():
    """Memory writes: each its own prompt, all starting with the same instructions. They are gathered (also
    across the answer groups between them) into common-prefix micro-batches, with the log-probs and gradient of
    each row run alone; a row that starts like no other stays alone."""
    from memrl.train.microbatch import MIN_COMMON_PREFIX

    rng = random.Random(11)
    head = [rng.randrange(3, VOCAB) for _ in range(MIN_COMMON_PREFIX + 6)]
    rand = lambda n: [rng.randrange(3, VOCAB) for _ in range(n)]  # noqa: E731
    writes = [_step(f"w{i}", head + rand(3 + 2 * i), rand(2 + i)) for i in range(4)]
    stranger = _step("x", rand(MIN_COMMON_PREFIX + 9), rand(3))
    answers = make_episodes(n_groups=1, n_per_group=3, shared_prompt=True)
    episodes = [
        _episode("a", "ga", *writes[:2]),
        *answers,
        _episode("b", "gb", writes[2], stranger, writes[3]),
    ]
    batch = TrajectoryBatchBuilder().build(episodes)
    records = seq_records(batch, torch.ones(batch.num_steps), torch.ones(batch.num_steps))
    micro = split_micro_batches(records, max_rows=3)
    named = [[batch.step_ids[r] for r in mb.rows] for mb in micro]
    answer_ids = [batch.step_ids[i] for i in range(2, 5)]
    assert named == [["w0", "w1", "w2"], ["w3"], answer_ids, ["x"]]  # in the order of their first row
    assert micro[0].prefix_ids.shape == (1, len(head))  # the shared instructions, forwarded once
    model = tiny_llama()
    truth = _alone(model.eval(), batch)
    logp_sum = torch.zeros(())
    for mb in micro:
        logp = token_logprobs(forward_logits(model, mb), mb.input_ids)
        for k, row in enumerate(mb.rows):
            assert torch.allclose(logp[(mb.seq_index == k) & (mb.adv != 0)].detach(), truth[row], atol=1e-5)
        logp_sum = logp_sum + (logp * mb.loss_mask).sum()
    logp_sum.backward()
    grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    ref = tiny_llama()
    sum(
        (token_logprobs(ref(input_ids=r.ids.unsqueeze(0)).logits, r.ids.unsqueeze(0))[0] * r.loss_mask).sum()
        for r in records
    ).backward()
    assert torch.allclose(grad, torch.cat([p.grad.flatten() for p in ref.parameters()]), atol=1e-5, rtol=1e-4)


def test_micro_batch_moves_every_tensor_to_the_model_device():
    """The update builds micro-batches on the CPU; a policy on an accelerator needs every tensor beside it."""
    records = [
        SeqRecord(
            ids=torch.arange(6), prompt_len=3, loss_mask=torch.tensor([0, 0, 0, 1.0, 1, 1]),
            old_logp=torch.zeros(6), adv=torch.ones(6), index=i,
        )
        for i in range(2)
    ]  # fmt: skip
    mb = split_micro_batches(records, 8)[0]
    moved = mb.to("meta")
    tensors = {k: v for k, v in vars(moved).items() if isinstance(v, torch.Tensor)}
    assert {"input_ids", "loss_mask", "adv", "seq_index", "prefix_ids"} <= set(tensors)
    assert all(v.device.type == "meta" for v in tensors.values())
    assert moved.rows == mb.rows and moved.scored_from == mb.scored_from
    assert mb.input_ids.device.type == "cpu"  # a copy: the original stays where it was


def test_rows_of_different_adapters_never_share_a_micro_batch():
    prompt = torch.arange(3, 80)
    records = [
        SeqRecord(
            ids=torch.cat([prompt, torch.tensor([5 + i, 6])]), prompt_len=len(prompt),
            loss_mask=torch.cat([torch.zeros(len(prompt)), torch.ones(2)]), old_logp=torch.zeros(len(prompt) + 2),
            adv=torch.ones(len(prompt) + 2), index=i, adapter="memory" if i % 2 else "default",
        )
        for i in range(4)
    ]  # fmt: skip
    micro = split_micro_batches(records, 8)
    assert [(mb.adapter, mb.rows) for mb in micro] == [("default", [0, 2]), ("memory", [1, 3])]
    with pytest.raises(ValueError, match="mixes the rows of adapters"):
        collate(records)
