"""LoRA adapters: one per role, saved and resumed together."""

from __future__ import annotations

import pytest
import torch

from memrl.train.config import LoraConfig, TrainConfig
from memrl.train.lora import (
    adapter_for,
    adapter_state,
    attach_lora,
    load_adapter_weights,
    lora_swapped,
    lora_tensors,
    save_adapter,
    saved_lora_tensors,
    trainable_parameters,
    use_adapter,
)
from tests.train.train_fixtures import tiny_llama


def _perturbed(per_role: bool, seed: int):
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8), per_role=per_role)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
    return model


def test_per_role_model_has_a_writer_adapter_and_the_optimizer_holds_both():
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8), per_role=True)
    shared = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    assert set(model.peft_config) == {"default", "memory"} and model.active_adapter == "default"
    assert sum(p.numel() for p in trainable_parameters(model)) == 2 * sum(
        p.numel() for p in trainable_parameters(shared)
    )
    assert adapter_for(model, "memory") == "memory" and adapter_for(model, "answer") == "default"
    assert adapter_for(shared, "memory") == "default"  # one LoRA plays both roles
    with use_adapter(model, "memory"):
        assert model.active_adapter == "memory"
    assert model.active_adapter == "default"


def test_save_and_resume_restore_both_adapters(tmp_path):
    trained = _perturbed(per_role=True, seed=0)
    save_adapter(trained, tmp_path)
    assert (tmp_path / "adapter_model.safetensors").is_file()  # the answer adapter, where PEFT readers look
    assert (tmp_path / "memory" / "adapter_model.safetensors").is_file()
    resumed = _perturbed(per_role=True, seed=1)
    load_adapter_weights(resumed, tmp_path)
    for name in ("default", "memory"):
        want, got = adapter_state(trained, name), adapter_state(resumed, name)
        assert all(torch.equal(want[k], got[k]) for k in want)


def test_resuming_a_per_role_run_from_a_shared_adapter_names_the_missing_writer(tmp_path):
    save_adapter(_perturbed(per_role=False, seed=0), tmp_path)
    with pytest.raises(FileNotFoundError, match="adapter 'memory'"):
        load_adapter_weights(_perturbed(per_role=True, seed=1), tmp_path)


def test_role_adapters_setting_lists_the_valid_choices():
    with pytest.raises(ValueError, match="shared.*per_role"):
        TrainConfig(role_adapters="two")


def test_lora_swapped_puts_other_weights_in_for_the_block_and_the_model_s_back_after():
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    own = lora_tensors(model)
    other = {k: torch.randn_like(v) for k, v in own.items()}
    ids = torch.tensor([[1, 5, 9, 3]])
    with torch.no_grad():
        before = model(input_ids=ids).logits
        with lora_swapped(model, other):
            assert all(torch.equal(p, other[k]) for k, p in model.named_parameters() if k in other)
            swapped = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert not torch.allclose(before, swapped) and torch.equal(before, after)
    with (
        pytest.raises(KeyError, match="has no parameter"),
        lora_swapped(model, {"nope.lora_A.weight": torch.zeros(1)}),
    ):
        pass


def test_saved_lora_tensors_reads_a_directory_and_leaves_the_model_as_it_was(tmp_path):
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    save_adapter(model, tmp_path / "a")
    saved = lora_tensors(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.mul_(3.0)
    now = lora_tensors(model)
    read = saved_lora_tensors(model, tmp_path / "a")
    assert read.keys() == saved.keys() and all(torch.equal(read[k], saved[k]) for k in saved)
    assert all(torch.equal(v, now[k]) for k, v in lora_tensors(model).items())
