"""Decode steps over static buffers (``memrl.policy.engine.cuda_graphs``): on CPU the same static-shape steps run
uncaptured, so everything but the capture itself is checked here against the eager decode loop; the capture is
checked where CUDA exists."""

from __future__ import annotations

import pytest
import torch

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.cuda_graphs import POSITION_BUCKET, GraphDecoder, _bucket_positions, _bucket_rows
from memrl.policy.engine.hf import HFPolicy
from memrl.testing import random_tiny_llama

PROMPTS = [
    "Q?",
    "Bob bought a red bike; what colour is it?",
    "Alice: I moved to Lisbon in May, and my sister stayed in Porto.",
    "chain",
    "x" * 40,
]


@pytest.fixture(scope="module")
def model_tok():
    return random_tiny_llama(seed=3, initializer_range=0.3)


def policy_for(model_tok, *, static: bool, limit: int = 8, **cfg) -> HFPolicy:
    model, tok = model_tok
    policy = HFPolicy.from_model(
        model, tok, PolicyConfig(model="random-peaked", seed=0, max_batch_size=limit, **cfg)
    )
    policy.eos_ids = []
    if static:
        policy._graphs = GraphDecoder(policy, capture=False)
    return policy


def requests(policy, budgets, temperature=0.0, n=1):
    enc = [tuple(policy.tokenizer.encode(t, add_special_tokens=False)) for t in PROMPTS]
    return [
        GenerationRequest(
            enc[i % len(enc)], SamplingParams(temperature=temperature, max_tokens=m, n=n, seed=i)
        )
        for i, m in enumerate(budgets)
    ]


def run(policy, reqs):
    outs = policy.generate(reqs)
    return [[s.token_ids for s in o] for o in outs], [[s.logprobs for s in o] for o in outs]


def test_bucket_sizes():
    assert [_bucket_rows(n) for n in (1, 3, 4, 5, 32)] == [1, 4, 4, 8, 32]
    assert _bucket_rows(10_000) is None  # more rows than any bucket: the eager path runs
    assert (
        _bucket_positions(1) == POSITION_BUCKET
        and _bucket_positions(POSITION_BUCKET + 1) == 2 * POSITION_BUCKET
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_steps_decode_what_the_eager_loop_decodes(model_tok, temperature):
    budgets = [12, 5, 9, 3, 7, 12, 4]
    eager = policy_for(model_tok, static=False)
    eager_ids, eager_lps = run(eager, requests(eager, budgets, temperature))
    static = policy_for(model_tok, static=True)
    static_ids, static_lps = run(static, requests(static, budgets, temperature))
    assert static_ids == eager_ids
    for a, b in zip(eager_lps, static_lps, strict=True):
        assert torch.allclose(torch.tensor(a[0]), torch.tensor(b[0]), atol=1e-4)
    graphs = static._graphs
    assert graphs.replays == max(budgets) - 1  # one decode step per token after the prefill's first
    # One capture per shape: compactions move the batch to a smaller row bucket, never a second graph of one shape.
    assert graphs.captures == len({key[:2] for key in graphs.graphs}) >= 2


def test_continuous_batching_readopts_rebuilt_caches(model_tok):
    """Rows beyond the limit join as others finish: each admission rebuilds the batch cache, which the next step
    copies into the static buffers; a compaction that drops rows does the same."""
    budgets = [20, 3, 3, 3, 3, 6, 2]
    eager = policy_for(model_tok, static=False, limit=2)
    eager_ids, _ = run(eager, requests(eager, budgets))
    static = policy_for(model_tok, static=True, limit=2)
    static_ids, _ = run(static, requests(static, budgets))
    assert static_ids == eager_ids
    assert [len(o[0]) for o in static_ids] == budgets
    assert static._graphs.captures <= 2  # buckets of 1 and 2 rows


def test_tree_branches_sharing_a_prefix_keep_the_eager_path(model_tok):
    static = policy_for(model_tok, static=True)
    prompt = tuple(static.tokenizer.encode("Alice: I moved to Lisbon in May. " * 6, add_special_tokens=False))
    static.generate([GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=2))])  # cache it
    eager = policy_for(model_tok, static=False)
    eager.generate([GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=2))])
    branches = [GenerationRequest(prompt, SamplingParams(temperature=1.0, max_tokens=6, n=4, seed=1))]
    replays = static._graphs.replays
    assert run(static, branches)[0] == run(eager, branches)[0]
    assert static._graphs.replays == replays  # the shared-prefix batch never entered the static buffers


def test_two_live_batches_never_share_buffers(model_tok):
    """Two streams decoding in turns on one policy: each batch gets its own buffers of the same shape."""
    static = policy_for(model_tok, static=True)
    eager = policy_for(model_tok, static=False)
    a, b = static.stream(), static.stream()
    # a's short row returns first while its long row waits in a's batch, then b decodes: were the two batches'
    # caches one buffer, b's steps would overwrite what a's long row continues from.
    ra, rb = requests(static, [3, 12]), requests(static, [12, 5], temperature=1.0)
    ia, ib = a.add(ra), b.add(rb)
    done_a, done_b = {}, {}
    while len(done_a) < len(ia) or len(done_b) < len(ib):
        if len(done_a) < len(ia):
            done_a.update(a.wait())
        if len(done_b) < len(ib):
            done_b.update(b.wait())
    a.close()
    b.close()
    assert [[done_a[i][0].token_ids] for i in ia] == run(eager, ra)[0]
    assert [[done_b[i][0].token_ids] for i in ib] == run(eager, rb)[0]
    assert len({key[:2] for key in static._graphs.graphs}) < static._graphs.captures  # same shapes, twice


def test_graph_mode_follows_the_lora_fold(model_tok):
    """A step recorded with the adapter folded in is not replayed with adapters disabled (another code path)."""
    from memrl.train.config import LoraConfig
    from memrl.train.lora import attach_lora

    model, tok = random_tiny_llama(seed=5, initializer_range=0.3)
    model = attach_lora(model, LoraConfig(r=4, alpha=8)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    static = policy_for((model, tok), static=True)
    eager = policy_for((model, tok), static=False, merge_lora=False)
    reqs = requests(static, [8, 8])
    assert run(static, reqs)[0] == run(eager, reqs)[0]
    with model.disable_adapter():
        bare = run(static, reqs)[0]
        assert bare == run(eager, reqs)[0]
    assert bare != run(static, reqs)[0]  # the adapter changes the tokens, so the modes were told apart
    modes = {key[3:6] for key in static._graphs.graphs}
    assert len(modes) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_captured_steps_decode_what_the_eager_loop_decodes(model_tok):
    model, tok = random_tiny_llama(seed=3, initializer_range=0.3)
    model = model.to("cuda").float()
    graphs = HFPolicy.from_model(model, tok, PolicyConfig(model="random-peaked", device="cuda"))
    eager = HFPolicy.from_model(
        model, tok, PolicyConfig(model="random-peaked", device="cuda", cuda_graphs=False)
    )
    graphs.eos_ids = eager.eos_ids = []
    reqs = requests(graphs, [12, 5, 9, 3])
    assert run(graphs, reqs)[0] == run(eager, reqs)[0]
    assert graphs._graphs.captures >= 1 and graphs._graphs.replays > 0
