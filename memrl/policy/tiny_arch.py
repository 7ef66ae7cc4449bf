"""The embedded model's architecture and tokenizers: a small Llama that needs no downloaded files.

Two tokenizers, both built from code: ``ByT5Tokenizer()`` (ids 0/1/2 pad/eos/unk, 3..258 the bytes, 259..383
extra ids, ``len(tok) = 384``), used by the random test models; and a byte-level BPE trained here on synthetic-
task text (:func:`bpe_tokenizer`, same pad/eos/unk ids), used by the embedded SFT model. Always encode with
``add_special_tokens=False`` (ByT5 appends eos otherwise).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

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


def bpe_tokenizer(texts: Iterable[str], vocab_size: int, *, isolate_spaces: bool = False):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``texts`` (deterministic for the same texts).

    Why BPE for the embedded model: a name or answer word is 1-3 tokens instead of 4-9 bytes, so copying it out of
    a fact is a short induction rather than a long one, and prompts are ~2.5x shorter. Byte-level pre-tokenisation
    keeps every string encodable (unseen text falls back to byte tokens).

    ``isolate_spaces``: GPT-2-style pre-tokenisation glues a space to the following word, so "Rocky" is
    ``' Ro' 'c' 'ky'`` inside a sentence but ``'R' 'oc' 'ky'`` after ``<answer>``: answering would mean re-spelling
    the word into other tokens, which a tiny model does not learn. A space as its own token makes both the same."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.Split(" ", behavior="isolated"), byte_level])
        if isolate_spaces
        else byte_level
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<pad>", "</s>", "<unk>"],  # ids 0/1/2 as in ByT5
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(texts, trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
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
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    config = tiny_llama_config(**overrides)
    config._attn_implementation = attn_implementation
    model = LlamaForCausalLM(config).eval()
    return model, byte_tokenizer()
