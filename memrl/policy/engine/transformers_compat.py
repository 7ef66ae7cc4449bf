"""The transformers internals memrl relies on, each checked against the installed transformers.

The HF backend goes below transformers' public API in three places (written up in ``docs/internals.md``,
"transformers internals"): its KV caches subclass ``DynamicLayer`` and replace a ``DynamicCache``'s layers
(:mod:`memrl.policy.engine.kv_cache`), it registers its own attention function and mask function
(:mod:`memrl.policy.engine.shared_attention`), and training repeats a prompt's cache for its group's responses
(:mod:`memrl.train.microbatch`). These are the reason for the upper bound on transformers in pyproject.toml.

:func:`check` returns one message per mismatch, each naming the internal and the memrl code that uses it::

    python -m memrl.policy.engine.transformers_compat      # prints the version and "ok", or the mismatches (exit 1)
"""

from __future__ import annotations

import importlib
import inspect
import sys
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Internal:
    """``path`` (``module:attribute.attribute``) must exist; when ``params`` is given, its signature must start
    with those parameters in that order (memrl or transformers calls it positionally)."""

    path: str
    used_by: str
    params: tuple[str, ...] | None = None


_LAYER = "memrl.policy.engine.kv_cache.PreallocatedLayer"
INTERNALS: tuple[Internal, ...] = (
    # KV cache: memrl's layers are DynamicLayers whose hooks transformers' Cache calls.
    Internal("transformers.cache_utils:DynamicLayer", f"{_LAYER} (subclass)"),
    Internal(
        "transformers.cache_utils:DynamicLayer.__init__", f"{_LAYER}.__init__ (super().__init__())", ("self",)
    ),
    Internal(
        "transformers.cache_utils:DynamicLayer.lazy_initialization",
        f"{_LAYER}.lazy_initialization (override)",
        ("self", "key_states", "value_states"),
    ),
    Internal(
        "transformers.cache_utils:DynamicLayer.update",
        f"{_LAYER}.update (override)",
        ("self", "key_states", "value_states"),
    ),
    Internal(
        "transformers.cache_utils:DynamicLayer.get_seq_length",
        f"{_LAYER}.get_seq_length (override)",
        ("self",),
    ),
    # Inherited, not called by memrl: its argument changed (cache_position → query_length) without harm, what
    # matters is that it derives the key length from get_seq_length (the decode equality tests check that).
    Internal("transformers.cache_utils:DynamicLayer.get_mask_sizes", f"{_LAYER} (inherited)"),
    Internal(
        "transformers.cache_utils:DynamicLayer.batch_select_indices",
        f"{_LAYER}.batch_select_indices (override)",
        ("self", "indices"),
    ),
    Internal(
        "transformers.cache_utils:DynamicCache",
        "memrl.policy.engine.kv_cache.preallocated_cache, SharedPrefixCache",
    ),
    Internal(
        "transformers.cache_utils:Cache.update",
        "the model's attention layers → memrl's layers",
        ("self", "key_states", "value_states", "layer_idx"),
    ),
    Internal(
        "transformers.cache_utils:Cache.get_seq_length",
        "memrl.policy.engine.hf (cached length)",
        ("self", "layer_idx"),
    ),
    Internal(
        "transformers.cache_utils:Cache.batch_select_indices",
        "memrl.policy.engine.batching.DecodeBatch.select",
        ("self", "indices"),
    ),
    Internal(
        "transformers.cache_utils:Cache.batch_repeat_interleave",
        "memrl.train.microbatch (a shared prompt's cache)",
        ("self", "repeats"),
    ),
    # Attention: memrl_sdpa is registered as an attention implementation and falls back to transformers' sdpa.
    Internal(
        "transformers:AttentionInterface.register",
        "memrl.policy.engine.shared_attention.register",
        ("key", "value"),
    ),
    Internal(
        "transformers.masking_utils:ALL_MASK_ATTENTION_FUNCTIONS.register",
        "memrl.policy.engine.shared_attention.register",
        ("key", "value"),
    ),
    Internal(
        "transformers.masking_utils:sdpa_mask",
        "memrl.policy.engine.shared_attention.register (mask for memrl_sdpa)",
    ),
    Internal(
        "transformers.integrations.sdpa_attention:sdpa_attention_forward",
        "memrl.policy.engine.shared_attention.memrl_sdpa (fallback)",
        ("module", "query", "key", "value", "attention_mask", "dropout", "scaling"),
    ),
    Internal(
        "transformers.masking_utils:sliding_window_overlay",
        "memrl.policy.engine.sliding_window.Positions.window_mask (the same kv > q - W, by position)",
        ("sliding_window",),
    ),
    Internal(
        "transformers:PreTrainedModel.set_attn_implementation",
        "memrl.policy.engine.hf (switch sdpa → memrl_sdpa)",
        ("self", "attn_implementation"),
    ),
)


def resolve(path: str) -> Any:
    module_name, _, attrs = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for attr in attrs.split("."):
        obj = getattr(obj, attr)
    return obj


def _params(obj: Any) -> list[str]:
    return list(inspect.signature(obj).parameters)


def check_internal(internal: Internal) -> str | None:
    """None if ``internal`` is as memrl expects, else a message naming it and its user in memrl."""
    where = f"transformers internal {internal.path.replace(':', '.')} (used by {internal.used_by})"
    try:
        obj = resolve(internal.path)
    except (ImportError, AttributeError) as exc:
        return f"{where} is missing: {exc}"
    if internal.params is None:
        return None
    found = _params(obj)
    if found[: len(internal.params)] != list(internal.params):
        return (
            f"{where} has parameters ({', '.join(found)}); memrl expects ({', '.join(internal.params)}, ...)"
        )
    required = [
        n
        for n, p in inspect.signature(obj).parameters.items()
        if n not in internal.params
        and p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if required:
        return f"{where} now requires ({', '.join(required)}), which memrl does not pass"
    return None


def check_layers() -> list[str]:
    """memrl's cache layers must be complete subclasses: a new abstract hook on transformers' layer base class
    (which the Cache would call) makes them uninstantiable."""
    try:
        from memrl.policy.engine.kv_cache import PreallocatedLayer
    except ImportError as exc:
        return [f"memrl.policy.engine.kv_cache cannot import its transformers base classes: {exc}"]
    try:
        layer = PreallocatedLayer(4)
    except TypeError as exc:
        return [
            f"transformers internal cache_utils.CacheLayerMixin gained a hook memrl's {_LAYER} lacks: {exc}"
        ]
    missing = [a for a in ("keys", "values", "is_initialized") if not hasattr(layer, a)]
    if missing:
        return [
            f"transformers internal cache_utils.DynamicLayer.__init__ no longer sets {missing} (used by {_LAYER})"
        ]
    return []


def check() -> list[str]:
    """Every mismatch between the installed transformers and what memrl relies on (empty = compatible)."""
    return [msg for msg in map(check_internal, INTERNALS) if msg is not None] + check_layers()


def main() -> int:
    import transformers

    problems = check()
    print(
        f"transformers {transformers.__version__}: "
        + ("ok" if not problems else f"{len(problems)} problem(s)")
    )
    for msg in problems:
        print(f"  - {msg}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
