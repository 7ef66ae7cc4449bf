"""Decoding with the LoRA adapter folded into the base weights (memrl.policy.engine.lora_merge)."""

from __future__ import annotations

import warnings

import torch

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.hf import HFPolicy
from memrl.policy.engine.lora_merge import lora_layers
from memrl.testing import random_tiny_llama
from memrl.train.config import LoraConfig
from memrl.train.lora import attach_lora

PROMPT = "Alice: I moved to Lisbon in May."


def _model(dtype=torch.float32, per_role: bool = False):
    """A tiny Llama with LoRA on every linear layer, each adapter perturbed (so folding it changes the output)."""
    model, tok = random_tiny_llama(seed=1, initializer_range=0.3)
    model = attach_lora(model.to(dtype), LoraConfig(r=4, alpha=8), per_role=per_role)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    return model.eval(), tok


def _base_weights(model) -> list[torch.Tensor]:
    return [layer.get_base_layer().weight.detach().clone() for layer in lora_layers(model)]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _greedy(policy: HFPolicy, n: int = 8):
    ids = tuple(policy.tokenizer.encode(PROMPT, add_special_tokens=False))
    [[out]] = policy.generate([GenerationRequest(ids, SamplingParams(temperature=0.0, max_tokens=n))])
    return out


@torch.no_grad()
def _manual_greedy(model, tok, n: int = 8) -> list[int]:
    ids = tok.encode(PROMPT, add_special_tokens=False)
    for _ in range(n):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[-n:]


def test_folded_decode_matches_the_adapter_and_unfolded_decode():
    model, tok = _model()
    folded = _greedy(HFPolicy.from_model(model, tok, PolicyConfig(model="x")))
    assert all(layer.merged for layer in lora_layers(model))  # the fold is kept for the next call
    plain = _greedy(HFPolicy.from_model(model, tok, PolicyConfig(model="x", merge_lora=False)))
    assert not any(layer.merged for layer in lora_layers(model))  # another forward unfolded it
    assert folded.token_ids == plain.token_ids
    assert torch.allclose(torch.tensor(folded.logprobs), torch.tensor(plain.logprobs), atol=1e-5)
    assert list(folded.token_ids) == _manual_greedy(model, tok)


def test_a_forward_the_policy_did_not_issue_trains_the_unmerged_adapter():
    """The trainer shares the module: its forward must see the original base weights and the LoRA path."""
    model, tok = _model()
    original = _base_weights(model)
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="x"))
    _greedy(policy)
    assert not _same(_base_weights(model), original)  # folded: the base weights hold the adapter now
    model.train()
    ids = torch.tensor([tok.encode(PROMPT, add_special_tokens=False)])
    model(ids).logits.float().logsumexp(-1).mean().backward()
    assert _same(_base_weights(model), original)
    grads = [p.grad for n, p in model.named_parameters() if "lora_A" in n]
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_bfloat16_base_weights_come_back_bit_exact_after_many_folds():
    """Unfolding copies the stash back: subtracting the delta again would drift in bfloat16."""
    model, tok = _model(torch.bfloat16)
    original = _base_weights(model)
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="x", dtype="bfloat16"))
    for _ in range(5):
        _greedy(policy, n=2)
        policy.invalidate_cache()  # as after every weight update
        assert _same(_base_weights(model), original)
    model.merge_adapter()  # PEFT's own merge and unmerge, for contrast: not exact in bfloat16
    model.unmerge_adapter()
    assert not _same(_base_weights(model), original)


def test_an_updated_adapter_is_folded_anew():
    model, tok = _model()
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="x"))
    before = _greedy(policy)
    with torch.no_grad():  # an optimizer step changes the LoRA weights in place; the trainer then publishes
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    policy.invalidate_cache()
    after = _greedy(policy)
    assert list(after.token_ids) == _manual_greedy(model, tok)
    assert after.logprobs != before.logprobs


def test_switching_to_the_writers_adapter_folds_it_without_peft_warnings():
    model, tok = _model(per_role=True)
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="x"))
    original = _base_weights(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # PEFT warns when an adapter is switched on a merged model
        answer = _greedy(policy)
        with policy.use_adapter("memory"):
            write = _greedy(policy)
            expected = _manual_greedy(model, tok)
        again = _greedy(policy)
    assert list(write.token_ids) == expected
    assert write.token_ids != answer.token_ids and again.token_ids == answer.token_ids
    assert torch.allclose(torch.tensor(again.logprobs), torch.tensor(answer.logprobs), atol=1e-5)
    policy.invalidate_cache()
    assert _same(_base_weights(model), original)


def test_switching_adapters_back_and_forth_folds_each_once_per_weight_version():
    """Per-turn writes switch to the writer's adapter and back thousands of times: each switch reuses the fold
    it made, until the adapter's weights change."""
    model, tok = _model(per_role=True)
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="x"))
    original = _base_weights(model)
    answer = _greedy(policy)
    with policy.use_adapter("memory"):
        write = _greedy(policy)
    for _ in range(3):
        with policy.use_adapter("memory"):
            assert _greedy(policy).token_ids == write.token_ids
        assert _greedy(policy).token_ids == answer.token_ids
    fold = policy.adapters.fold
    assert fold.folds == 2  # the answer's adapter and the writer's, once each
    with torch.no_grad():  # an update of the writer's adapter, in place
        for name, param in model.named_parameters():
            if "lora_B" in name and ".memory." in name:
                param.normal_(0, 0.3)
    for cache in (policy.prefix_cache, *policy.adapters.caches.values()):
        cache.clear()  # stale states; the fold is left to the version counters (no invalidate_cache)
    with policy.use_adapter("memory"):
        changed = _greedy(policy)
        expected = _manual_greedy(model, tok)
    assert fold.folds == 3 and list(changed.token_ids) == expected and changed.logprobs != write.logprobs
    policy.invalidate_cache()
    assert _same(_base_weights(model), original)


def test_decoding_with_adapters_disabled_runs_the_bare_base():
    model, tok = _model()
    original = _base_weights(model)
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="x"))
    adapted = _greedy(policy)
    with model.disable_adapter():  # e.g. a reference policy's rollout
        policy.invalidate_cache()  # the radix cache holds the adapted model's states
        bare = _greedy(policy)
        assert _same(_base_weights(model), original) and not any(m.merged for m in lora_layers(model))
        expected = _manual_greedy(model, tok)
    assert list(bare.token_ids) == expected and bare.logprobs != adapted.logprobs


def test_policies_sharing_a_model_share_one_fold():
    """Two policies over one model (a benchmark's arms), taking turns: neither stashes the other's folded weights
    as the base, so the adapter is never folded twice and the base comes back exact."""
    model, tok = _model()
    original = _base_weights(model)
    a = HFPolicy.from_model(model, tok, PolicyConfig(model="x"))
    b = HFPolicy.from_model(model, tok, PolicyConfig(model="x", prefix_cache_tokens=0))
    outs = [_greedy(p).token_ids for p in (a, b, a, b)]
    assert outs == [outs[0]] * 4 and list(outs[0]) == _manual_greedy(model, tok)
    a.adapters.fold.restore()
    assert a.adapters.fold is b.adapters.fold and _same(_base_weights(model), original)
