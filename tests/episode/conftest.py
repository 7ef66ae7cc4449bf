"""Shared fixtures: a random-init tiny byte-level Llama saved to disk (real HF forward passes, no download)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Same role-marker chat template shape the embedded tiny model uses: plain markers, generation after <|assistant|>.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    import torch
    from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tok = ByT5Tokenizer()
    tok.chat_template = TINY_CHAT_TEMPLATE
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
