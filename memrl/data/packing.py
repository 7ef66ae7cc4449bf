"""Causal-LM forward passes over memrl batches: packed (no cross-sequence attention) and padded (verl layout).

Packed batches are one ``[1, T]`` stream. On a GPU with flash-attention, varlen kernels consume that directly
(``cu_seqlens`` / position-id restarts). On CPU (and for any attention implementation) this module instead
places the sequences into **bins** (first-fit decreasing, capacity ≥ the longest sequence), runs the bins as a
small ``[B, C]`` batch and gives every bin a block-diagonal causal mask plus per-sequence position ids, so no
token attends across a sequence boundary. The work done is ``≈ T`` tokens (plus a few % bin slack) instead
of ``N × max_len`` for padded-to-max rows — that is where packing's speed comes from.

    >>> lp = packed_forward_logprobs(model, batch)         # [1, T], aligned with batch.input_ids
    >>> loss = -(lp * batch.response_mask).sum()            # summed response NLL

For micro-batching a large batch, split it into groups of bins (:func:`plan_bins`) or by token budget
(:func:`memrl.data.batch.split_by_tokens`), and call the forward once per micro-batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from memrl.types import PackedBatch


def seq_lengths(batch: PackedBatch) -> list[int]:
    """Per-row token counts (prompt + response)."""
    return (batch.prompt_lengths + batch.response_lengths).tolist()


def plan_bins(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """First-fit-decreasing bin packing of sequence indices; every bin holds ≤ ``capacity`` tokens.

    Returns bins as lists of indices (each bin sorted by index, bins ordered by first index) so the result is
    deterministic. Raises ``ValueError`` if a sequence is longer than ``capacity``.
    """
    too_long = [i for i, n in enumerate(lengths) if n > capacity]
    if too_long:
        i = too_long[0]
        raise ValueError(f"sequence {i} has {lengths[i]} tokens > bin capacity {capacity}")
    bins: list[list[int]] = []
    free: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda k: (-lengths[k], k)):
        for b, room in enumerate(free):
            if lengths[i] <= room:
                bins[b].append(i)
                free[b] -= lengths[i]
                break
        else:
            bins.append([i])
            free.append(capacity - lengths[i])
    return sorted((sorted(b) for b in bins), key=lambda b: b[0])


def block_causal_mask(segment_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask ``[B, 1, C, C]``: query q sees key k iff same segment and k ≤ q.

    ``segment_ids`` is ``[B, C]``; padding slots must carry their own unique segment id so that their rows
    are not fully masked (which would give NaN in softmax).
    """
    c = segment_ids.shape[1]
    same = segment_ids.unsqueeze(2) == segment_ids.unsqueeze(1)  # [B, C, C]
    causal = torch.ones(c, c, dtype=torch.bool, device=segment_ids.device).tril()
    allowed = same & causal
    mask = torch.zeros(allowed.shape, dtype=dtype, device=segment_ids.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask.unsqueeze(1)


def _token_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[B, C, V]`` logits, ``[B, C]`` ids → ``[B, C]``: log p(ids[:, t] | logits[:, t - 1]); 0 at t = 0."""
    lp = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(lp, (1, 0))


def _model_dtype(model: torch.nn.Module) -> torch.dtype:
    return next(model.parameters()).dtype


def _bin_tensors(batch: PackedBatch, bins: Sequence[Sequence[int]], pad_token_id: int):
    """Lay bins out as ``[B, W]`` ids/positions/segments plus the global token index of every slot (-1 = pad)."""
    cu = batch.cu_seqlens.tolist()
    width = max(sum(cu[i + 1] - cu[i] for i in b) for b in bins)
    shape = (len(bins), width)
    ids = torch.full(shape, pad_token_id, dtype=torch.long)
    pos = torch.zeros(shape, dtype=torch.long)
    src = torch.full(shape, -1, dtype=torch.long)
    # Pads get unique negative segment ids: each pad attends only to itself.
    seg = -1 - torch.arange(width).expand(shape).clone()
    flat_ids = batch.input_ids[0]
    for row, b in enumerate(bins):
        col = 0
        for i in b:
            n = cu[i + 1] - cu[i]
            ids[row, col : col + n] = flat_ids[cu[i] : cu[i + 1]]
            pos[row, col : col + n] = torch.arange(n)
            src[row, col : col + n] = torch.arange(cu[i], cu[i + 1])
            seg[row, col : col + n] = i
            col += n
    return ids, pos, seg, src


def packed_forward_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    *,
    bin_capacity: int | None = None,
    bins_per_forward: int = 8,
    pad_token_id: int = 0,
) -> torch.Tensor:
    """Per-token log-probs ``[1, T]`` aligned with ``batch.input_ids`` (packed layout), differentiable.

    ``out[0, t] = log p(input_ids[t] | earlier tokens of the same sequence)``; 0 on each sequence's first
    token. Multiply by ``response_mask`` to get the policy's response log-probs (aligned with
    ``old_log_probs``). ``bin_capacity`` defaults to the longest sequence; ``bins_per_forward`` bins go through
    the model per call. ``model`` is any HF-style causal LM accepting a 4-D additive attention mask.
    """
    if batch.layout != "packed":
        raise ValueError(f"packed_forward_logprobs needs a packed batch, got layout {batch.layout!r}")
    lengths = seq_lengths(batch)
    capacity = max(bin_capacity or 0, max(lengths))
    bins = plan_bins(lengths, capacity)
    device, dtype = next(model.parameters()).device, _model_dtype(model)
    total = int(batch.cu_seqlens[-1])
    idx_parts, val_parts = [], []
    for start in range(0, len(bins), bins_per_forward):
        ids, pos, seg, src = _bin_tensors(batch, bins[start : start + bins_per_forward], pad_token_id)
        ids, pos, seg = ids.to(device), pos.to(device), seg.to(device)
        mask = block_causal_mask(seg, dtype)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        lp = _token_logprobs(logits, ids)
        keep = (src >= 0).to(device) & (pos > 0)  # real tokens that have a predecessor in their sequence
        idx_parts.append(src.to(device)[keep])
        val_parts.append(lp[keep])
    out = torch.zeros(total, dtype=torch.float32, device=device)
    out = out.index_put((torch.cat(idx_parts),), torch.cat(val_parts))
    return out.unsqueeze(0)


def padded_forward_logprobs(model: torch.nn.Module, batch: PackedBatch) -> torch.Tensor:
    """Response log-probs ``[N, R]`` for a padded batch (verl's ``compute_log_prob``), 0 on padding."""
    if batch.layout != "padded":
        raise ValueError(f"padded_forward_logprobs needs a padded batch, got layout {batch.layout!r}")
    device = next(model.parameters()).device
    ids = batch.input_ids.to(device)
    attn = batch.attention_mask.to(device)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=batch.position_ids.to(device)).logits
    lp = _token_logprobs(logits, ids)
    p = batch.prompts.shape[1]
    return lp[:, p:] * attn[:, p:]
