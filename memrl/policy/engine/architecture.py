"""What the HF engine can serve of a model's architecture, decided once at load.

The engine runs its own attention paths below transformers' model-agnostic code (:mod:`memrl.policy.engine.kv_cache`,
:mod:`memrl.policy.engine.shared_attention`). It serves global causal attention, grouped key/value heads, a model's own
attention scaling, and sliding-window layers (masked by position, :mod:`memrl.policy.engine.sliding_window`). A feature
it does not apply would decode differently from transformers without an error, so a model that needs one is
refused here, naming the feature and what to use instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memrl.policy.errors import PolicyError

INSTEAD = "policy.backend=vllm, or the model outside memrl's engine through transformers' own generate"


@dataclass(frozen=True)
class Architecture:
    """A model's attention as the engine sees it: the family, its window and which layers use it, and the
    features the engine cannot serve (empty when it serves the model)."""

    model_type: str
    layers: int
    window: int | None
    sliding_layers: list[int] = field(default_factory=list)
    unsupported: list[str] = field(default_factory=list)


def text_config(config):
    """The decoder's config (a multimodal model's text config; the config itself otherwise)."""
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def architecture(model) -> Architecture:
    """Read ``model``'s (possibly PEFT-wrapped) config and modules."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = text_config(base.config)
    window, sliding = window_of(base.config)
    unsupported = []
    cap = getattr(cfg, "attn_logit_softcapping", None)
    if cap:
        unsupported.append(f"attention-logit soft-capping (config.attn_logit_softcapping={cap})")
    if any(n.endswith("sinks") for n, _ in base.named_parameters()):
        unsupported.append("attention sinks (learned per-head sink logits)")
    chunk = getattr(cfg, "attention_chunk_size", None)
    if chunk or "chunked_attention" in (getattr(cfg, "layer_types", None) or ()):
        unsupported.append(f"chunked attention (config.attention_chunk_size={chunk})")
    if getattr(cfg, "use_bidirectional_attention", False):
        unsupported.append("bidirectional attention (config.use_bidirectional_attention=True)")
    return Architecture(
        model_type=str(getattr(cfg, "model_type", "unknown")),
        layers=int(cfg.num_hidden_layers),
        window=window,
        sliding_layers=sliding,
        unsupported=unsupported,
    )


def check_servable(model, name: str, engine_attention: bool) -> int | None:
    """The sliding window the engine must apply (``None``: global attention only), or a :class:`PolicyError`
    naming what it cannot serve. ``engine_attention``: the model attends through ``memrl_sdpa`` (its
    ``policy.attn_implementation`` is ``sdpa``), the only path that windows by position."""
    arch = architecture(model)
    what = f"policy.model={name!r} ({arch.model_type})"
    if arch.unsupported:
        raise PolicyError(
            f"{what} needs {'; '.join(arch.unsupported)}, which memrl's HF engine does not apply: it would decode "
            f"differently from transformers. Use {INSTEAD}."
        )
    if arch.window is not None and not engine_attention:
        raise PolicyError(
            f"{what} has sliding-window attention (window {arch.window} on {len(arch.sliding_layers)} of "
            f"{arch.layers} layers), which memrl's HF engine applies only through its sdpa attention; set "
            f"policy.attn_implementation=sdpa, or use {INSTEAD}."
        )
    return arch.window


def window_of(config) -> tuple[int | None, list[int]]:
    """``(window, sliding layers)`` of a model config (its text config for a multimodal one): the window size
    and the indices of the layers that use it; ``(None, [])`` for a model with global attention only."""
    cfg = text_config(config)
    window = getattr(cfg, "sliding_window", None)
    if not window or getattr(cfg, "use_sliding_window", True) is False:
        return None, []
    n = int(cfg.num_hidden_layers)
    types = getattr(cfg, "layer_types", None)
    if types and getattr(cfg, "model_type", "") not in _WINDOW_ON_EVERY_LAYER:
        return int(window), [i for i, t in enumerate(types) if t == "sliding_attention"]
    return int(window), list(range(n))


# Families whose attention passes config.sliding_window to every layer, whatever layer_types says.
_WINDOW_ON_EVERY_LAYER = frozenset({"mistral", "mixtral", "phi3", "starcoder2"})
