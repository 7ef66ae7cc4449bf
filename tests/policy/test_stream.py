"""Generation streams (memrl.policy.stream): requests come back as soon as their samples finish, and requests
added meanwhile join the rows still decoding (HF); other backends fall back to one generate call per wait."""

from __future__ import annotations

import pytest

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.hf import HFPolicy
from memrl.policy.stream import BlockingStream, open_stream
from memrl.testing import random_tiny_llama
from memrl.testing.scripted import ScriptedPolicy
from tests.policy.engine.test_batching import enc, record_forwards


@pytest.fixture(scope="module")
def policy():
    model, tok = random_tiny_llama(seed=3, initializer_range=0.3)
    pol = HFPolicy.from_model(model, tok, PolicyConfig(model="random-peaked", seed=0, max_batch_size=4))
    pol.eos_ids = []  # rows run to max_tokens: which request finishes first is known
    return pol


def _req(policy, text, max_tokens, n=1, seed=7):
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens, n=n, seed=seed, top_logprobs=3)
    return GenerationRequest(enc(policy, text), params)


def test_requests_return_as_they_finish_and_late_requests_join_the_running_batch(policy):
    long, short = _req(policy, "Alice moved to Lisbon.", 30, n=2), _req(policy, "Bob has a cat.", 5, seed=8)
    late = _req(policy, "Carol paints.", 6, seed=9)
    reference = policy.generate([long, short, late])
    calls, hook = record_forwards(policy)
    stream = policy.stream()
    try:
        ids = stream.add([long, short])
        first = stream.wait()
        assert [rid for rid, _ in first] == [ids[1]]  # the short request, while the long one still decodes
        [late_id] = stream.add([late])
        done = dict(first)
        while len(done) < 3:
            done.update(stream.wait())
    finally:
        hook.remove()
        stream.close()
    assert stream.wait() == []
    # Same samples as one generate call of all three (per-row sampling streams; batching does not matter).
    for rid, ref in zip([ids[0], ids[1], late_id], reference, strict=True):
        assert [o.token_ids for o in done[rid]] == [o.token_ids for o in ref]
        for o, r in zip(done[rid], ref, strict=True):
            assert o.logprobs == pytest.approx(r.logprobs, abs=1e-4)
    # The late request joined the long one's batch: one decode run (30 steps) serves all three, not 30 + 6.
    decode_steps = [rows for rows, _ in calls if rows > 0]
    assert len(decode_steps) < 30 + 6 and max(rows for rows, _ in calls) >= 3


def test_closing_a_stream_unlocks_the_cached_prefixes_of_rows_never_started(policy):
    policy.invalidate_cache()
    [[out]] = policy.generate([_req(policy, "Dan likes tea.", 3)])
    cont = enc(policy, "Dan likes tea.") + out.token_ids  # cached but for its last token
    waiting = [GenerationRequest(cont, SamplingParams(max_tokens=3, seed=s)) for s in range(6)]
    stream = policy.stream()
    # 4 slots: the 4 long rows run first; when they end 4 continuations join, 2 still wait (locked prefixes).
    stream.add([_req(policy, "Eve runs.", 25, n=4)] + waiting)
    [(_, outs)] = stream.wait()
    assert len(outs) == 4
    cache = policy.prefix_cache
    assert max(node.locks for node in cache._nodes()) == 2
    stream.close()
    assert all(node.locks == 0 for node in cache._nodes())
    cache.budget_tokens = 0
    cache._evict()  # nothing locked: everything can go
    assert len(cache) == 0
    cache.budget_tokens = policy.cfg.prefix_cache_tokens


def test_backends_without_a_stream_get_one_generate_call_per_wait():
    from transformers import ByT5Tokenizer

    pol = ScriptedPolicy(ByT5Tokenizer(), lambda ctx: "ok")
    stream = open_stream(pol)
    assert isinstance(stream, BlockingStream)
    ids = stream.add([GenerationRequest((5, 6)), GenerationRequest((7,), SamplingParams(n=2))])
    done = stream.wait()
    assert [rid for rid, _ in done] == ids and [len(outs) for _, outs in done] == [1, 2]
    assert pol.stats.batch_sizes == [2] and stream.wait() == []  # one generate call for both


def test_on_step_sees_each_unfinished_request_grow_by_one_token_per_step(policy):
    """The hook a server streams from: after every decode step ``so_far`` holds the tokens decoded so far,
    which end as the finished output's tokens."""
    req = _req(policy, "Erin reads.", 6, n=2)
    [reference] = policy.generate([req])
    stream = policy.stream()
    seen: list[list[tuple[int, ...]]] = []
    try:
        [rid] = stream.add([req])
        [(done_id, outs)] = stream.wait(
            on_step=lambda: seen.append([o.token_ids for o in stream.so_far(rid)])
        )
    finally:
        stream.close()
    assert done_id == rid and stream.so_far(rid) == []  # handed back: nothing partial left
    assert [[len(t) for t in step] for step in seen] == [[k, k] for k in range(1, 7)]  # step k: k tokens each
    assert [o.token_ids for o in outs] == [o.token_ids for o in reference]
    assert seen[-1] == [o.token_ids for o in outs]
