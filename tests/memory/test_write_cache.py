"""The greedy write cache: a frozen writer's replies are read back across writers and runs, never across weights."""

from __future__ import annotations

import pytest
import torch

from memrl.memory.config import MemoryConfig
from memrl.memory.llm import policy_text_generator
from memrl.memory.writer import WRITER_ADAPTER, PolicyWriter, WriteRequest
from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.engine.radix_cache import common_prefix_len
from memrl.testing import random_tiny_llama
from memrl.types import TurnRole, TurnSpec

TURNS = [
    TurnSpec(TurnRole.HISTORY, text, f"D1:{i}", speaker="Ann", timestamp="1 May 2023")
    for i, text in enumerate(["I moved to Rome last week.", "My sister Mia is a nurse.", "We adopted a cat."])
]


class CountingClient:
    """A real HF policy that counts the prompts it generates for."""

    def __init__(self, policy) -> None:
        self.inner = policy
        self.prompts = 0
        self.asked: list[tuple[int, ...]] = []  # the prompts of the last generate call

    def generate(self, requests):
        self.prompts += len(requests)
        self.asked = [tuple(r.prompt_ids) for r in requests]
        return self.inner.generate(requests)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.fixture(autouse=True)
def own_cache_dir(tmp_path, monkeypatch):
    """Each test starts from an empty cache (the policy's weights are the same in every test)."""
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path))


@pytest.fixture
def lora_policy():
    """A tiny Llama with a per-role writer adapter whose lora_B is non-zero (so its weights change its replies)."""
    from peft import LoraConfig, get_peft_model

    from memrl.policy.config import PolicyConfig
    from memrl.policy.engine.hf import HFPolicy

    model, tok = random_tiny_llama(seed=3, initializer_range=0.3)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    peft_model = get_peft_model(model, lora)
    peft_model.add_adapter(WRITER_ADAPTER, lora)
    _perturb(peft_model, seed=0)
    return HFPolicy.from_model(peft_model, tok, PolicyConfig(model="random-tiny-lora", seed=0))


def _perturb(model, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name and f".{WRITER_ADAPTER}." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)


def _writer(policy, **cfg) -> tuple[PolicyWriter, CountingClient]:
    client = CountingClient(policy)
    cfg = MemoryConfig(extractor="policy", write_max_tokens=12, **cfg)
    return PolicyWriter(cfg, policy_text_generator(client)), client


def _requests() -> list[WriteRequest]:
    return [WriteRequest((t,)) for t in TURNS]


def test_a_second_writer_reads_the_greedy_replies_back_without_generating(lora_policy):
    first, c1 = _writer(lora_policy)
    prompts, written = first.sample(_requests(), [1, 1, 1], 0.0)
    assert c1.prompts == 3 and first.cache_hits == 0
    again, c2 = _writer(lora_policy)  # another run over the same weights
    prompts2, read = again.sample(_requests(), [1, 1, 1], 0.0)
    assert c2.prompts == 0 and again.cache_hits == 3
    assert prompts2 == prompts
    assert [(s[0].response_ids, s[0].text, s[0].logprobs) for s in read] == [
        (s[0].response_ids, s[0].text, s[0].logprobs) for s in written
    ]


def test_only_the_misses_are_generated_and_their_replies_equal_an_uncached_write(lora_policy):
    warm, _ = _writer(lora_policy)
    warm.sample(_requests()[:1], [1], 0.0)
    mixed, client = _writer(lora_policy)
    _, got = mixed.sample(_requests(), [1, 1, 1], 0.0)
    plain, _ = _writer(lora_policy, write_cache=False)
    _, fresh = plain.sample(_requests(), [1, 1, 1], 0.0)
    assert client.prompts == 2 and mixed.cache_hits == 1
    assert [s[0].response_ids for s in got] == [s[0].response_ids for s in fresh]


def test_new_writer_weights_never_read_the_old_replies(lora_policy):
    first, _ = _writer(lora_policy)
    _, before = first.sample(_requests(), [1, 1, 1], 0.0)
    _perturb(lora_policy.model, seed=1)  # a training update of the writer, in place
    lora_policy.invalidate_cache()
    writer, client = _writer(lora_policy)
    _, after = writer.sample(_requests(), [1, 1, 1], 0.0)
    assert client.prompts == 3 and writer.cache_hits == 0
    assert [s[0].response_ids for s in after] != [s[0].response_ids for s in before]


def test_the_answer_adapter_does_not_change_the_writers_cache(lora_policy):
    """Per-role adapters: training the answer role leaves the writer's replies (and its cache) valid."""
    first, _ = _writer(lora_policy)
    first.sample(_requests(), [1, 1, 1], 0.0)
    with torch.no_grad():
        for name, param in lora_policy.model.named_parameters():
            if "lora_B" in name and ".default." in name:
                param.add_(1.0)
    writer, client = _writer(lora_policy)
    writer.sample(_requests(), [1, 1, 1], 0.0)
    assert client.prompts == 0 and writer.cache_hits == 3


def test_sampled_writes_and_a_disabled_cache_always_generate(lora_policy, tmp_path):
    sampled, client = _writer(lora_policy)
    sampled.sample(_requests(), [2, 2, 2], 1.0, seed=0)
    sampled.sample(_requests(), [1, 1, 1], 1.0, seed=0)
    assert client.prompts == 6 and not (tmp_path / "writes").exists()
    off, client = _writer(lora_policy, write_cache=False)
    off.sample(_requests(), [1, 1, 1], 0.0)
    off.sample(_requests(), [1, 1, 1], 0.0)
    assert client.prompts == 6 and not (tmp_path / "writes").exists()


def test_a_cache_that_cannot_be_created_logs_once_and_the_writes_go_on(lora_policy, monkeypatch, caplog):
    import sqlite3

    from memrl import blob_cache

    def full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")

    plain, _ = _writer(lora_policy, write_cache=False)
    _, expected = plain.sample(_requests(), [1, 1, 1], 0.0)
    monkeypatch.setattr(blob_cache.sqlite3, "connect", full)
    writer, client = _writer(lora_policy)
    with caplog.at_level("WARNING", logger="memrl.blob_cache"):
        _, got = writer.sample(_requests(), [1, 1, 1], 0.0)
        writer.sample(_requests(), [1, 1, 1], 0.0)
    assert [s[0].response_ids for s in got] == [s[0].response_ids for s in expected]
    assert client.prompts == 6 and writer.cache_hits == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    # one warning per file that could not be made (the writer's cache, the shared drafts), not one per write
    assert [w.split(" /")[0] for w in warnings] == ["memory write cache", "memory write drafts"]
    assert all("disk is full" in w for w in warnings)


def _nudge(policy, scale: float, seed: int) -> None:
    """Change the writer's LoRA in place, as an update does (the update also drops the policy's folded weights)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.model.named_parameters():
            if "lora_B" in name and f".{WRITER_ADAPTER}." in name:
                param.add_(torch.randn(param.shape, generator=gen) * scale)
    policy.invalidate_cache()


@pytest.mark.parametrize("scale", [1e-4, 0.5])
def test_a_changed_writer_takes_the_drafts_it_agrees_with_and_decodes_the_rest(lora_policy, scale):
    """After an update the writer misses its cache; the last writer's replies are checked in one forward, the
    ones that are its own greedy replies are taken and the others decoded from where they differ. The replies
    equal decoding them from the start, either way."""
    before, _ = _writer(lora_policy)
    _, old = before.sample(_requests(), [1, 1, 1], 0.0)
    _nudge(lora_policy, scale, seed=1)
    plain, _ = _writer(lora_policy, write_cache=False)
    _, decoded = plain.sample(_requests(), [1, 1, 1], 0.0)
    writer, client = _writer(lora_policy)
    _, got = writer.sample(_requests(), [1, 1, 1], 0.0)
    assert [s[0].response_ids for s in got] == [s[0].response_ids for s in decoded]
    for g, d in zip(got, decoded, strict=True):
        # (a padded batch forward against a decode: the last bits of the logits differ)
        assert torch.allclose(torch.tensor(g[0].logprobs), torch.tensor(d[0].logprobs), atol=5e-3)
    same = sum(o[0].response_ids == d[0].response_ids for o, d in zip(old, decoded, strict=True))
    assert writer.cache_hits == 0 and writer.draft_hits == same and client.prompts == 3 - same
    if scale < 1e-3:
        assert same == 3  # a small update keeps every greedy reply: nothing is decoded
    else:
        assert same < 3  # a large one changes some: those are decoded, not taken
        # ... from the first token where the draft differs on: each is a prompt plus the greedy reply's head
        full = [plain.prompt_ids(r) for r in _requests()]
        assert all(any(a[: len(f)] == f and len(a) > len(f) for f in full) for a in client.asked)
    again, client = _writer(lora_policy)  # and the replies are now this writer's cache
    again.sample(_requests(), [1, 1, 1], 0.0)
    assert again.cache_hits == 3 and client.prompts == 0


def test_one_call_decodes_a_repeated_prompt_once(lora_policy):
    writer, client = _writer(lora_policy)
    reqs = _requests()
    _, got = writer.sample([reqs[0], reqs[1], reqs[0]], [1, 1, 1], 0.0)
    assert client.prompts == 2 and got[0][0].response_ids == got[2][0].response_ids


def test_replies_read_from_the_cache_become_the_drafts_again(lora_policy):
    """The drafts follow the writer that wrote last: after another writer wrote, a reread of the first writer's
    cache makes its replies the drafts a slightly updated copy of it then checks."""
    first, _ = _writer(lora_policy)
    first.sample(_requests(), [1, 1, 1], 0.0)
    saved = {n: p.detach().clone() for n, p in lora_policy.model.named_parameters() if "lora_" in n}
    _nudge(lora_policy, 0.5, seed=2)
    other, _ = _writer(lora_policy)
    _, theirs = other.sample(_requests(), [1, 1, 1], 0.0)  # the drafts are now its replies
    with torch.no_grad():
        for n, p in lora_policy.model.named_parameters():
            if n in saved:
                p.copy_(saved[n])
    lora_policy.invalidate_cache()
    reread, client = _writer(lora_policy)
    _, mine = reread.sample(_requests(), [1, 1, 1], 0.0)
    assert reread.cache_hits == 3 and client.prompts == 0
    assert [s[0].response_ids for s in theirs] != [s[0].response_ids for s in mine]  # not vacuous
    _nudge(lora_policy, 1e-4, seed=1)
    updated, client = _writer(lora_policy)
    updated.sample(_requests(), [1, 1, 1], 0.0)
    assert updated.draft_hits == 3 and client.prompts == 0


def test_smollm2_writes_the_same_replies_from_checked_drafts_as_decoded(smollm2_policy):
    """SmolLM2-135M on real write prompts: drafts checked from the prefix cache (one taken whole, one wrong from its
    third token on, one wrong from its first) give the replies plain decoding gives, and the wrong ones are
    decoded on from the cached states where they depart."""
    from memrl.policy.config import PolicyConfig
    from memrl.policy.engine.hf import HFPolicy

    uncached = HFPolicy.from_model(
        smollm2_policy.model, smollm2_policy.tokenizer, PolicyConfig(model="smollm2", prefix_cache_tokens=0)
    )
    plain, _ = _writer(uncached, write_cache=False)
    _, decoded = plain.sample(_requests(), [1, 1, 1], 0.0)
    want = [s[0].response_ids for s in decoded]
    policy = HFPolicy.from_model(
        smollm2_policy.model, smollm2_policy.tokenizer, PolicyConfig(model="smollm2")
    )
    writer, client = _writer(policy)
    prompts = [writer.prompt_ids(r) for r in _requests()]
    policy.generate([GenerationRequest(prompts[0][:-1], SamplingParams(temperature=0.0, max_tokens=1))])
    wrong = [want[0], (*want[1][:2], want[1][2] + 1, *want[1][3:]), (want[2][0] + 1, *want[2][1:])]
    cache = writer._cache()
    cache.set_drafts(prompts, [(ids, (0.0,) * len(ids)) for ids in wrong])
    checked = policy.forward_stats["check_tokens"]
    _, got = writer.sample(_requests(), [1, 1, 1], 0.0)
    assert [s[0].response_ids for s in got] == want
    assert writer.draft_hits == 1 and client.prompts == 2
    # the checks fed no instruction tokens: each prompt's tail past the shared system message and its draft
    shared = min(common_prefix_len(prompts[0], p) for p in prompts[1:])
    assert policy.forward_stats["check_tokens"] - checked <= sum(
        len(p) - shared + len(w) for p, w in zip(prompts, wrong, strict=True)
    )
    # and decoding went on from where each wrong draft departed: the asked prompts end in the greedy heads
    assert sorted(len(a) for a in client.asked) == [len(prompts[2]) + 1, len(prompts[1]) + 3]
