"""Shared-prefix ("cascade") attention for rows that all continue from one stored prefix state.

Tree branches forked at one node decode together, and their cached prefix (prompt + parent response, often
1000+ positions) is the same for every row. Plain attention reads a per-row copy of it at every decode step, so
``B`` branches cost ``B`` copies in memory and ``B`` passes over it; here the prefix keys/values are stored once
(``[kv_heads, C, head_dim]``, the stored entry itself) and all rows' queries meet them in one matmul. The rows'
own positions (their suffix and generated tokens) are attended separately with the usual mask, and the two
partial softmaxes are merged exactly through their log-sum-exp (as FlashInfer's cascade attention and vLLM's
prefix-shared decode kernels do).

Registered as the transformers attention implementation ``memrl_sdpa``: with no shared prefix in the call it is
exactly transformers' ``sdpa``, so a model can keep it on. The HF backend passes the prefix as the
``memrl_shared_prefix`` forward kwarg (transformers forwards unknown kwargs down to the attention function).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memrl.policy.engine.sliding_window import POSITIONS_KWARG, Positions

IMPLEMENTATION = "memrl_sdpa"


@dataclass
class SharedPrefix:
    """The prefix every row of a batch continues from: ``keys[l]`` / ``values[l]`` are its
    ``[kv_heads, C, head_dim]`` states at layer ``l``. The batch cache reserves its ``width = C`` positions,
    followed by the rows' own positions."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    @property
    def width(self) -> int:
        return int(self.keys[0].shape[-2])


def _partial(scores: torch.Tensor, values: torch.Tensor):
    """Unnormalised softmax pieces: running max ``m``, sum ``l`` and ``exp(scores - m) @ values``."""
    m = scores.amax(-1, keepdim=True).clamp(min=torch.finfo(scores.dtype).min)  # all-masked rows stay finite
    p = torch.exp(scores - m)
    return m, p.sum(-1, keepdim=True), p @ values


def _prefix_partial(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    scaling: float,
    mask: torch.Tensor | None = None,
):
    """All of ``query [b, H, q, D]``'s rows against one ``[Hkv, C, D]`` prefix in one matmul per head group,
    under ``mask`` (bool ``[b, 1, q, C]``, True = attend: a sliding window; ``None`` = all visible); returns
    ``(m, l, o)`` shaped ``[b, H, q, 1|1|D]``."""
    b, H, q, D = query.shape
    Hkv, C = keys.shape[0], keys.shape[1]
    g = H // Hkv
    qh = query.view(b, Hkv, g, q, D).permute(1, 2, 0, 3, 4).reshape(Hkv, g * b * q, D)
    scores = (qh @ keys.transpose(1, 2)) * scaling
    if mask is not None:
        hidden = ~mask[:, 0][None, None]  # [1, 1, b, q, C] against scores' [Hkv, g, b, q, C]
        scores = scores.view(Hkv, g, b, q, C).masked_fill(hidden, float("-inf")).view(Hkv, g * b * q, C)
    parts = _partial(scores, values)
    return [t.view(Hkv, g, b, q, -1).permute(2, 0, 1, 3, 4).reshape(b, H, q, -1) for t in parts]


def shared_prefix_attention(
    query: torch.Tensor,
    own_keys: torch.Tensor,
    own_values: torch.Tensor,
    prefix: SharedPrefix,
    layer: int,
    own_mask: torch.Tensor | None,
    scaling: float,
    prefix_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of ``query [B, H, q, D]`` over the prefix (visible to every query unless ``prefix_mask``, bool
    ``[B, 1, q, C]``, hides some of it) followed by the rows' own ``keys/values [B, Hkv, S, D]`` under
    ``own_mask`` (bool ``[B, 1, q, S]``, True = attend; ``None`` = all visible). Returns ``[B, q, H, D]`` (the
    layout transformers' attention functions return)."""
    H = query.shape[1]
    m1, l1, o1 = _prefix_partial(query, prefix.keys[layer], prefix.values[layer], scaling, prefix_mask)
    g = H // own_keys.shape[1]
    if g > 1:
        own_keys = own_keys.repeat_interleave(g, dim=1)
        own_values = own_values.repeat_interleave(g, dim=1)
    s2 = (query @ own_keys.transpose(-1, -2)) * scaling
    if own_mask is not None:
        s2 = s2.masked_fill(~own_mask, float("-inf"))
    m2, l2, o2 = _partial(s2, own_values)
    m = torch.maximum(m1, m2)
    a1, a2 = torch.exp(m1 - m), torch.exp(m2 - m)
    out = (o1 * a1 + o2 * a2) / (l1 * a1 + l2 * a2)
    return out.transpose(1, 2).contiguous()


def _masked_gqa(module, query: torch.Tensor, mask: torch.Tensor | None, kwargs: dict) -> bool:
    """Grouped-query heads under a boolean mask on CPU: transformers then copies every key/value head ``g``
    times per layer and step (its ``repeat_kv``: it only trusts GQA kernels without a mask on CUDA), which on a
    padded decode batch costs more than the attention itself. torch's CPU sdpa takes ``enable_gqa`` with a mask
    exactly (tested against the repeated heads), so that case is served here without the copies."""
    return (
        query.device.type == "cpu"
        and getattr(module, "num_key_value_groups", 1) > 1
        and isinstance(mask, torch.Tensor)
        and mask.dtype == torch.bool
        and not kwargs.get("output_attentions", False)
        and kwargs.get("position_bias") is None
        and kwargs.get("cache") is None
    )


def _gqa_sdpa(query, key, value, mask, dropout: float, scaling: float | None) -> torch.Tensor:
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling, enable_gqa=True
    )
    return out.transpose(1, 2).contiguous()


# Query rows per piece of a tail (see causal_tail_attention), and the longest tail cut into pieces: pieces make a
# write's short tail faster and an answer's long one slower (docs/experiments.md).
TAIL_PIECE_ROWS = 192
TAIL_PIECES_UP_TO = 768


def causal_tail_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scaling: float):
    """Attention of ``query [B, H, q, D]``, the last ``q`` of ``key/value``'s ``S`` positions (``[B, Hkv, S, D]``,
    no padding), each seeing every position up to its own. Returns ``[B, q, H, D]``.

    A prompt's tail after the ``C = S - q`` positions that came from the prefix cache (an answer prompt after its
    cached instructions: q ~1,200, C ~140; a write after its cached instructions: q ~270), or a whole prompt
    (C = 0). torch's CPU kernel runs the first as a masked ``q x S`` attention that computes every block. Here each
    piece of the queries sees everything before it (no mask) and its own causal square (the causal kernel), two
    calls merged exactly through their log-sum-exp. A tail of up to :data:`TAIL_PIECES_UP_TO` queries goes in
    pieces of about :data:`TAIL_PIECE_ROWS` rows, a longer one in one piece (measured faster there)."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q, C = query.shape[2], key.shape[2] - query.shape[2]
    n = max(1, round(q / TAIL_PIECE_ROWS)) if q <= TAIL_PIECES_UP_TO else 1
    size = -(-q // n)
    outs = []
    for a in range(0, q, size):
        b = min(q, a + size)
        piece = query[:, :, a:b]
        o2, l2 = flash(piece, key[:, :, C + a : C + b], value[:, :, C + a : C + b], 0.0, True, scale=scaling)
        if C + a == 0:
            outs.append(o2)
            continue
        o1, l1 = flash(piece, key[:, :, : C + a], value[:, :, : C + a], 0.0, False, scale=scaling)
        lse = torch.logaddexp(l1, l2)
        w1, w2 = torch.exp(l1 - lse).unsqueeze(-1), torch.exp(l2 - lse).unsqueeze(-1)
        outs.append((o1.float() * w1 + o2.float() * w2).to(query.dtype))
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    return out.transpose(1, 2).contiguous()


def decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, scaling: float
) -> torch.Tensor:
    """A few new positions per row: ``query [B, H, q, D]`` over ``key/value [B, Hkv, T, D]`` under ``mask`` (bool
    ``[B, 1, q, T]``, True = attend; ``None`` = all, for ``q = 1``). Returns ``[B, q, H, D]``.

    A decode step (``q = 1``) or a speculative one: the query heads (and positions) of each key/value head are one
    ``[g q, D] x [D, T]`` product, so the cache is read once per step; the scores and softmax are float32 as in
    the fused kernel. torch's CPU sdpa runs a single query through its blocked prefill kernel, which took most of
    a LoCoMo answer batch's decode steps (32 rows of ~1,400 cached positions)."""
    B, H, q, D = query.shape
    Hkv, T = key.shape[1], key.shape[2]
    g = H // Hkv
    qh = query.reshape(B, Hkv, g * q, D).float()  # head h = kv head h // g, as transformers' repeat_kv
    scores = torch.matmul(qh, key.float().transpose(-1, -2)) * scaling  # [B, Hkv, g q, T]
    if mask is not None:
        allowed = mask.reshape(B, 1, 1, -1, T).expand(B, 1, g, q, T).reshape(B, 1, g * q, T)
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.matmul(probs, value).reshape(B, H, q, D)
    return out.transpose(1, 2) if q > 1 else out.reshape(B, 1, H, D)


def _single_query(query: torch.Tensor, mask: torch.Tensor | None, kwargs: dict) -> bool:
    """A CPU decode step :func:`decode_attention` serves: one query per row, a boolean padding mask or none."""
    return (
        query.device.type == "cpu"
        and query.shape[2] == 1
        and (mask is None or (mask.dtype == torch.bool and mask.shape[-2] == 1))
        and not kwargs.get("output_attentions", False)
        and kwargs.get("position_bias") is None
    )


def _windowed(query, attention_mask, window_mask: torch.Tensor) -> torch.Tensor:
    """The forward's mask (``None``: causal for several queries, all visible for one) cut to a sliding window."""
    if attention_mask is None:
        if query.shape[2] == 1:
            return window_mask
        q, T = query.shape[2], window_mask.shape[-1]
        attention_mask = torch.ones(q, T, dtype=torch.bool, device=query.device).tril(T - q)[None, None]
    if attention_mask.dtype != torch.bool:
        raise TypeError("memrl_sdpa expects a boolean attention mask (transformers' sdpa mask)")
    return attention_mask & window_mask


def _window_mask(kwargs: dict, engine_path: bool) -> torch.Tensor | None:
    """The sliding-window mask of this layer (``None`` on a global layer, or where the window cuts nothing)."""
    window = kwargs.get("sliding_window")
    positions: Positions | None = kwargs.pop(POSITIONS_KWARG, None)
    if not window:
        return None
    if positions is None:
        # The engine's own paths ignore transformers' mask: without positions they would not window at all.
        if engine_path:
            raise RuntimeError(
                f"memrl_sdpa: a sliding-window layer (window {window}) was called on an engine path without "
                "the positions it masks by"
            )
        return None  # a plain forward (training, scoring a padded batch): transformers' mask holds the window
    return positions.window_mask(int(window))


def memrl_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers attention-interface function: shared-prefix attention when the forward carries a
    :class:`SharedPrefix`, :func:`causal_tail_attention` when it says ``memrl_causal_tail`` (an unpadded batch
    continuing from a cached prefix, on CPU), else transformers' own sdpa. A sliding-window layer whose window
    cuts some key of the forward attends under the window by position (:mod:`memrl.policy.engine.sliding_window`)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    shared: SharedPrefix | None = kwargs.pop("memrl_shared_prefix", None)
    causal_tail = kwargs.pop("memrl_causal_tail", False)
    # A speculative step's few queries per row under their [B, 1, q, T] mask (memrl.policy.engine.speculative).
    draft_check = kwargs.pop("memrl_draft_check", False)
    window = _window_mask(kwargs, engine_path=shared is not None or causal_tail or draft_check)
    if window is not None and shared is None:
        mask = _windowed(query, attention_mask, window)
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        if dropout == 0.0 and (draft_check or _single_query(query, mask, kwargs)):
            return decode_attention(query, key, value, mask, scale), None
        if _masked_gqa(module, query, mask, kwargs):
            return _gqa_sdpa(query, key, value, mask, dropout, scaling), None
        return sdpa_attention_forward(
            module, query, key, value, mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if shared is None:
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        if dropout == 0.0 and (draft_check or _single_query(query, attention_mask, kwargs)):
            return decode_attention(query, key, value, attention_mask, scale), None
        if causal_tail and query.shape[2] > 1 and query.device.type == "cpu" and dropout == 0.0:
            return causal_tail_attention(query, key, value, scale), None
        if _masked_gqa(module, query, attention_mask, kwargs):
            return _gqa_sdpa(query, key, value, attention_mask, dropout, scaling), None
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    C = shared.width
    if attention_mask is not None:
        if attention_mask.dtype != torch.bool:
            raise TypeError("memrl_sdpa expects a boolean attention mask (transformers' sdpa mask)")
        own_mask = attention_mask[..., C:]
    elif query.shape[2] > 1:  # no padding: plain causal among the rows' own positions, right-aligned
        q, S = query.shape[2], key.shape[2]
        own_mask = torch.ones(q, S, dtype=torch.bool, device=query.device).tril(S - q)[None, None]
    else:
        own_mask = None
    prefix_mask = None
    if window is not None:
        own_mask = window[..., C:] if own_mask is None else own_mask & window[..., C:]
        prefix_mask = window[..., :C]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = shared_prefix_attention(query, key, value, shared, module.layer_idx, own_mask, scale, prefix_mask)
    return out, None


def register() -> str:
    """Register ``memrl_sdpa`` (attention + its mask function) with transformers; returns the name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, memrl_sdpa)
    ALL_MASK_ATTENTION_FUNCTIONS.register(IMPLEMENTATION, sdpa_mask)
    return IMPLEMENTATION
