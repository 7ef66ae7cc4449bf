"""Random-init tiny models for fast unit tests and benches of speed, not a product feature.

A small Llama built from code in about a second (no downloaded files) and a byte-level tokenizer:
``ByT5Tokenizer()`` with ids 0/1/2 pad/eos/unk, 3..258 the bytes, 259..383 extra ids (``len(tok) = 384``). Its
weights are random, so it writes noise: use it where real forward passes, KV caches and timings matter but the
text does not. Always encode with ``add_special_tokens=False`` (ByT5 appends eos otherwise).
"""

from __future__ import annotations

# A compact role-tagged template: every byte costs a position in a byte-level model.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)


def byte_tokenizer():
    """A ``ByT5Tokenizer`` with :data:`CHAT_TEMPLATE` (saved with the model, so reloads keep it)."""
    from transformers import ByT5Tokenizer

    tok = ByT5Tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_llama_config(
    *,
    vocab_size: int = 384,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 4096,
    initializer_range: float = 0.02,
):
    """A LlamaConfig (pad 0, eos 1, no bos); 384 ids = the byte vocabulary. Defaults = the random test model."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        rope_theta=10000.0,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        tie_word_embeddings=True,
        initializer_range=initializer_range,
    )


def random_tiny_llama(seed: int = 0, attn_implementation: str = "sdpa", **overrides):
    """A randomly initialised tiny Llama (seconds to build) and its tokenizer — for tests and benches."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = tiny_llama_config(**overrides)
    config._attn_implementation = attn_implementation
    model = LlamaForCausalLM(config).eval()
    return model, byte_tokenizer()
