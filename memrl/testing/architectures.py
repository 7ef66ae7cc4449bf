"""Tiny random-init models of the families users train, built from transformers' own config classes.

Each family keeps the architecture features that change how attention or the weights must be handled: Qwen2's
q/k/v bias, Qwen3's q/k norms, Gemma 3's sliding + global layers (its own scaling, embeddings scaled by
sqrt(hidden), ``(1 + w)`` norms), Phi-3's fused ``qkv_proj`` / ``gate_up_proj``, Mistral's sliding window on
every layer, and a mixture-of-experts family (Qwen3-MoE). Sizes are seconds on a CPU; the byte tokenizer of
:mod:`memrl.testing.models` serves all of them.

The weights are *sharpened* (:func:`sharpen`): random init at transformers' defaults attends almost uniformly, so
an engine that drops a sliding window or mis-merges two softmaxes changes the output too little to notice. Here
the attention logits are large, as a trained model's are, so such an error changes the greedy tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from memrl.testing.models import byte_tokenizer

# Positions a sliding-window layer sees: small, so that test prompts run many windows long.
TINY_WINDOW = 24

_COMMON = dict(
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=None,
    tie_word_embeddings=True,
    initializer_range=0.2,
)


@dataclass(frozen=True)
class Family:
    """One architecture: how to build its tiny config and model class, and what it exercises."""

    name: str
    config: Callable[[], object]
    model_class: str  # in transformers
    features: str
    sliding_window: int | None = None


def _llama():
    from transformers import LlamaConfig

    return LlamaConfig(num_hidden_layers=2, **_COMMON)


def _qwen2():
    from transformers import Qwen2Config

    return Qwen2Config(num_hidden_layers=2, **_COMMON)


def _qwen3():
    from transformers import Qwen3Config

    return Qwen3Config(num_hidden_layers=2, head_dim=16, **_COMMON)


def _gemma3():
    from transformers import Gemma3TextConfig

    common = {**_COMMON, "bos_token_id": 2}
    return Gemma3TextConfig(
        num_hidden_layers=3,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=TINY_WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        **common,
    )


def _phi3():
    from transformers import Phi3Config

    return Phi3Config(num_hidden_layers=2, sliding_window=None, **_COMMON)


def _mistral():
    from transformers import MistralConfig

    return MistralConfig(num_hidden_layers=2, head_dim=16, sliding_window=TINY_WINDOW, **_COMMON)


def _qwen3_moe():
    from transformers import Qwen3MoeConfig

    common = {**_COMMON, "intermediate_size": 64}
    return Qwen3MoeConfig(
        num_hidden_layers=2,
        head_dim=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        **common,
    )


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("llama", _llama, "LlamaForCausalLM", "SmolLM2's architecture"),
        Family("qwen2", _qwen2, "Qwen2ForCausalLM", "q/k/v bias"),
        Family("qwen3", _qwen3, "Qwen3ForCausalLM", "q/k norms"),
        Family(
            "gemma3",
            _gemma3,
            "Gemma3ForCausalLM",
            "sliding + global layers, query_pre_attn_scalar, scaled embeddings",
            TINY_WINDOW,
        ),
        Family("phi3", _phi3, "Phi3ForCausalLM", "fused qkv_proj / gate_up_proj"),
        Family("mistral", _mistral, "MistralForCausalLM", "sliding window on every layer", TINY_WINDOW),
        Family("qwen3_moe", _qwen3_moe, "Qwen3MoeForCausalLM", "mixture of experts, q/k norms"),
    )
}


@torch.no_grad()
def sharpen(model, factor: float = 3.0) -> None:
    """Make attention far from uniform: scale the query projection (or, where queries and keys are normalised
    after it, the q/k norm gains) so the attention logits grow by about ``factor`` (or ``factor**2``)."""
    for name, module in model.named_modules():
        for norm in ("q_norm", "k_norm"):
            sub = getattr(module, norm, None)
            if sub is not None and hasattr(sub, "weight"):
                # Gemma's norms multiply by (1 + w), the others by w.
                gemma = "gemma" in type(sub).__name__.lower()
                w = sub.weight
                w.copy_((1 + w) * factor - 1 if gemma else w * factor)
        if name.endswith("self_attn") and getattr(module, "q_norm", None) is None:
            proj = getattr(module, "q_proj", None)
            if proj is not None:
                proj.weight.mul_(factor)
            elif hasattr(module, "qkv_proj"):  # Phi-3: the first rows of the fused projection are the queries
                q_rows = module.config.num_attention_heads * module.head_dim
                module.qkv_proj.weight[:q_rows].mul_(factor)


def random_tiny(
    family: str, seed: int = 0, attn_implementation: str = "sdpa", sharp: bool = True, **overrides
):
    """A random-init tiny model of ``family`` (a key of :data:`FAMILIES`) in float32 and the byte tokenizer;
    ``overrides`` set config fields (vLLM's CPU attention needs ``head_dim`` >= 32, for one)."""
    import transformers

    if family not in FAMILIES:
        raise KeyError(f"unknown family {family!r}; valid: {sorted(FAMILIES)}")
    spec = FAMILIES[family]
    torch.manual_seed(seed)
    config = spec.config()
    for key, value in overrides.items():
        setattr(config, key, value)
    config._attn_implementation = attn_implementation
    model = getattr(transformers, spec.model_class)(config).eval()
    if sharp:
        sharpen(model)
    return model, byte_tokenizer()


def fast_byte_tokenizer():
    """A fast (``tokenizers``) byte-level tokenizer with the byte tokenizer's ids (pad 0, eos 1, unk 2, byte ``b``
    = ``3 + b``) and chat template. Saved beside a model, it loads under any family's tokenizer class: a saved
    ByT5 tokenizer does not where transformers maps the model type to a tokenizer of its own (Qwen2, Phi-3,
    Mistral)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    from memrl.testing.models import CHAT_TEMPLATE

    byte_chars = bytes_to_unicode()
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{byte_chars[b]: 3 + b for b in range(256)}}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tk.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    return tok
