"""LoRA adapters of the HF backend (:mod:`memrl.policy.engine.adapters`): hot swap, per-role switching, loading."""

from __future__ import annotations

import torch

from memrl.policy.base import GenerationRequest
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.hf import HFPolicy
from memrl.testing import random_tiny_llama
from tests.policy.engine.hf_fixtures import PROMPTS, enc, forward_logsoftmax, greedy, manual_greedy


def test_lora_adapter_generation_and_hot_swap(tmp_path):
    from peft import LoraConfig, get_peft_model

    model, tok = random_tiny_llama(seed=1, initializer_range=0.3)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    policy = HFPolicy.from_model(peft_model, tok, PolicyConfig(model="x"))
    prompt = enc(policy, PROMPTS[0])
    [[base]] = policy.generate([GenerationRequest(prompt, greedy(10))])  # lora_B = 0: no-op
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.5)
    peft_model.save_pretrained(tmp_path / "adapter")
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.zero_()
    policy.load_adapter(tmp_path / "adapter")  # hot swap: weights change, cached prefixes are dropped
    [[swapped]] = policy.generate([GenerationRequest(prompt, greedy(10))])
    assert swapped.cached_tokens == 0
    assert list(swapped.token_ids) == manual_greedy(policy.model, prompt, 10)
    ref = forward_logsoftmax(policy.model, prompt, swapped.token_ids)
    assert not torch.allclose(torch.tensor(base.logprobs), torch.tensor(swapped.logprobs), atol=1e-3)
    assert torch.allclose(
        torch.tensor(swapped.logprobs), ref[torch.arange(10), torch.tensor(swapped.token_ids)], atol=1e-4
    )


def _per_role_model(seed: int = 1):
    """A tiny Llama with two adapters, the writer's ("memory") perturbed so the two play differently."""
    from memrl.train.config import LoraConfig
    from memrl.train.lora import attach_lora

    model, tok = random_tiny_llama(seed=seed, initializer_range=0.3)
    model = attach_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]), per_role=True)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B.memory" in name:
                param.normal_(0, 0.5)
    return model.eval(), tok


def test_use_adapter_generates_with_the_writers_adapter_and_its_own_prefix_cache():
    model, tok = _per_role_model()
    policy = HFPolicy.from_model(model, tok, PolicyConfig(model="x"))
    prompt = enc(policy, PROMPTS[0])
    req = GenerationRequest(prompt, greedy(10))
    [[answer]] = policy.generate([req])
    with policy.use_adapter("memory"):
        assert model.active_adapter == "memory"
        [[write]] = policy.generate([req])
        expected = manual_greedy(model, prompt, 10)
    assert model.active_adapter == "default"
    assert list(write.token_ids) == expected != list(answer.token_ids)
    assert write.cached_tokens == 0  # the answer adapter's cached prompt states are not the writer's
    [[again]] = policy.generate([req])
    assert again.token_ids == answer.token_ids and again.cached_tokens > 0
    with policy.use_adapter("nope"):  # an adapter the model lacks leaves it as it is
        assert model.active_adapter == "default"


def test_lora_path_with_a_writer_adapter_loads_both(tmp_path):
    from memrl.train.lora import adapter_state, save_adapter

    trained, tok = _per_role_model()
    save_adapter(trained, tmp_path / "adapter")
    assert (tmp_path / "adapter" / "memory" / "adapter_model.safetensors").is_file()
    bare, _ = random_tiny_llama(seed=1, initializer_range=0.3)
    policy = HFPolicy.from_model(bare, tok, PolicyConfig(model="x"))
    policy.load_adapter(tmp_path / "adapter")
    assert set(policy.model.peft_config) == {"default", "memory"}
    for name in ("default", "memory"):
        want, got = adapter_state(trained, name), adapter_state(policy.model, name)
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
