"""Sliding-window attention in the HF engine's own attention paths (Mistral, Gemma 2/3, Phi-3, Qwen2 with its
window on).

A sliding-window layer lets a query at position ``p`` see the keys at positions ``p - W < k <= p``
(transformers' ``sliding_window_overlay``). transformers builds that mask from a 2-D padding mask by *column*
index, which equals position only when a row's real tokens sit in consecutive columns. The engine's batches break
that: a row continuing from a cached prefix has a hole between its cached and its new columns, rejected drafts
leave masked columns, and its fast paths (a decode step with a ready-made padding mask, the causal tail after a
cached prefix, shared-prefix attention) take no transformers mask at all.

So the engine hands every forward the *positions* of its queries and key columns (:class:`Positions`, the
``memrl_positions`` forward kwarg); the attention function (:func:`memrl.policy.engine.shared_attention.memrl_sdpa`)
receives each layer's window from the model itself (the ``sliding_window`` kwarg: ``None`` on global layers) and
masks by position distance. Positions are per row, so holes and padding do not shift the window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

POSITIONS_KWARG = "memrl_positions"


@dataclass
class Positions:
    """``query [B, q]``: the RoPE position of each fed token; ``keys [B, T]``: the position of each key column
    (padding columns hold any value: the padding mask hides them)."""

    query: torch.Tensor
    keys: torch.Tensor
    _masks: dict[int, torch.Tensor | None] = field(default_factory=dict, repr=False)

    def window_mask(self, window: int) -> torch.Tensor | None:
        """Bool ``[B, 1, q, T]``, True where the key lies inside the query's window; ``None`` when no key of the
        forward lies outside it (the window cuts nothing, so the layer attends as a global one). Computed once per
        window size and forward: every sliding layer of a forward shares it."""
        if window not in self._masks:
            inside = self.keys[:, None, :] > self.query[:, :, None] - window  # [B, q, T]
            self._masks[window] = None if bool(inside.all()) else inside[:, None]
        return self._masks[window]


def key_positions(mask: torch.Tensor | None, batch: int, total: int, device) -> torch.Tensor:
    """The position of each of ``total`` key columns, ``[B, total]``, from the forward's attention mask as the
    engine builds it: ``None`` (no padding: column = position), a 2-D ``[B, T]`` 0/1 mask, or a 4-D bool
    ``[B, 1, q, T]`` one (its last query row sees every real column of its row)."""
    if mask is None:
        return torch.arange(total, device=device)[None].expand(batch, total)
    real = mask[:, 0, -1, :] if mask.dim() == 4 else mask
    return real.long().cumsum(-1) - 1


def positions_kwargs(mask, pos: torch.Tensor, total: int) -> dict[str, Positions]:
    """The forward kwarg carrying :class:`Positions` for queries at ``pos [B, q]`` over ``total`` key columns."""
    return {POSITIONS_KWARG: Positions(pos, key_positions(mask, pos.shape[0], total, pos.device))}


def causal_bool_mask(mask: torch.Tensor, q: int) -> torch.Tensor:
    """A 2-D ``[B, T]`` padding mask as the 4-D bool ``[B, 1, q, T]`` one transformers would build for the last
    ``q`` columns (padding and causal by column): handed over ready-made, transformers applies it to every layer
    as it is, and the attention function adds each sliding layer's window by position."""
    B, T = mask.shape
    cols = torch.arange(T, device=mask.device)
    causal = cols[None, :] <= (T - q + torch.arange(q, device=mask.device))[:, None]  # [q, T]
    return mask.bool()[:, None, None, :] & causal[None, None]
