"""Prompt-lookup speculative decoding for the HF backend (``policy.speculative_tokens``), as vLLM's ``ngram``
speculative method and "prompt lookup decoding" do.

A decode step of a small model on CPU reads every weight once for a handful of rows: feeding each row a few more
positions costs little more than one, so a step that checks ``k`` drafted tokens as well as the sampled one can
emit up to ``k + 1`` tokens for about the price of one. The drafts need no second model: what a row writes often
repeats what it has read or written (the memory writer's ``NOOP`` lines, names and phrases copied from the turns,
an answer quoted from a retrieved passage), so the draft is what followed the latest earlier occurrence of the
row's last few tokens (:func:`propose`).

A drafted token is kept exactly when it is the token the row would have chosen at that position: the draw of
:func:`memrl.policy.engine.sampling.choose_tokens` depends only on the logits and the row's ``(seed, step)``, so the
check is exact for sampled rows as well as greedy ones, and outputs are those of plain decoding (up to the
floating-point rounding of a forward over several positions instead of one). A row stops keeping drafts before
a token that would end it (a stop token or string, its budget): the next plain sampling ends it as usual.

Rejected drafts leave columns in the batch cache that the row's mask hides (columns no row kept are cut off),
the same holes a left-padded row has; positions are per row, so they stay valid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from memrl.policy.engine.sampling import choose_tokens

if TYPE_CHECKING:
    from memrl.policy.engine.batching import DecodeBatch, DecodeRow

# The longest n-gram matched against earlier tokens (then shorter ones): vLLM's prompt_lookup_max default.
MAX_NGRAM = 3
# A checking step feeds at most this many positions (rows x (1 + draft)). A narrow step costs about the same with
# or without drafts (the weights are read once either way); a wide one turns compute bound, and an answer batch's
# drafts, mostly rejected, then cost more than they save (docs/internals.md).
MAX_CHECKED_POSITIONS = 24


def propose(tokens: Sequence[int], k: int, max_ngram: int = MAX_NGRAM) -> list[int]:
    """Up to ``k`` tokens that followed the latest earlier occurrence of the last ``n`` tokens of ``tokens``, for
    the longest ``n <= max_ngram`` that occurs earlier; none when even the last token is new."""
    size = len(tokens)
    if k <= 0 or size < 2:
        return []
    last = tokens[-1]
    for n in range(min(max_ngram, size - 1), 0, -1):
        tail = list(tokens[size - n :])
        # the latest start s < size - n whose n tokens equal the tail and that has a token after it
        for s in range(size - n - 1, -1, -1):
            if tokens[s + n - 1] == last and list(tokens[s : s + n]) == tail:
                return list(tokens[s + n : s + n + k])
    return []


def drafts_for(rows: Sequence[DecodeRow], k: int) -> list[list[int]] | None:
    """Each row's draft of at most ``k`` tokens, fewer where the batch is wide (:data:`MAX_CHECKED_POSITIONS`):
    none for finished rows, and never more than a row's budget leaves room for (its last token is sampled
    plainly). ``None`` when no row has one."""
    k = min(k, MAX_CHECKED_POSITIONS // len(rows) - 1)
    if k <= 0:
        return None
    out = []
    for row in rows:
        room = row.budget - len(row.out) - 1
        out.append(
            propose(row.prompt + tuple(row.out), min(k, room)) if row.finish is None and room > 0 else []
        )
    return out if any(out) else None


def speculative_step(policy: Any, batch: DecodeBatch, drafts: list[list[int]]) -> None:
    """Feed every row its last token and its draft in one forward, keep each row's drafted tokens up to its first
    mismatch, and leave ``batch.logits`` predicting each row's next token (after its last kept one)."""
    rows, mask = batch.rows, batch.mask
    B, T = mask.shape
    K = max(len(d) for d in drafts)
    dev = mask.device
    for layer in batch.cache.layers:
        layer.reserve(1 + K)
    ids = torch.tensor(
        [[r.out[-1], *d, *([policy.pad_id] * (K - len(d)))] for r, d in zip(rows, drafts, strict=True)],
        device=dev,
    )
    lengths = torch.tensor([len(d) for d in drafts], device=dev)
    fed = torch.arange(1 + K, device=dev)[None] <= lengths[:, None]  # [B, 1 + K]: the draft slots in use
    causal = torch.ones(1 + K, 1 + K, dtype=torch.bool, device=dev).tril()
    attend = torch.cat(
        [mask.bool()[:, None, None, :].expand(B, 1, 1 + K, T), (fed[:, None, None, :] & causal)], dim=-1
    )
    logits = policy.forward_positions(
        ids, attend, batch.pos + 1 + torch.arange(1 + K, device=dev), batch.cache
    )
    kept = _accept(rows, drafts, logits)
    A = max(kept)
    for layer in batch.cache.layers:
        layer.truncate(T + 1 + A)
    keep = torch.tensor(kept, device=dev)
    batch.mask = torch.cat(
        [mask, (torch.arange(1 + A, device=dev)[None] <= keep[:, None]).to(mask.dtype)], dim=1
    )
    batch.pos = batch.pos + 1 + keep[:, None]
    batch.logits = logits[torch.arange(B, device=dev), keep]
    batch.padded = not bool(batch.mask.all())
    stats = policy.forward_stats
    stats["draft_tokens"] += sum(len(d) for d in drafts)
    stats["accepted_tokens"] += sum(kept)


def _accept(rows: Sequence[DecodeRow], drafts: Sequence[list[int]], logits: torch.Tensor) -> list[int]:
    """How many drafted tokens each row keeps (appended to its output with their log-probs): one
    :func:`choose_tokens` call over every drafted position of every row."""
    where = [(b, j) for b, d in enumerate(drafts) for j in range(len(d))]
    kept = [0] * len(rows)
    if not where:
        return kept
    dev = logits.device
    bs, js = torch.tensor([b for b, _ in where], device=dev), torch.tensor([j for _, j in where], device=dev)
    choices = choose_tokens(
        logits[bs, js],
        [rows[b].params for b, _ in where],
        [rows[b].seed for b, _ in where],
        [len(rows[b].out) + j for b, j in where],
    )
    by_row: dict[int, list] = {}
    for (b, _), choice in zip(where, choices, strict=True):
        by_row.setdefault(b, []).append(choice)
    for b, row_choices in by_row.items():
        row = rows[b]
        for token, choice in zip(drafts[b], row_choices, strict=True):
            if choice.token != token or row.stopper.check([*row.out, token])[0]:
                break
            row.out.append(token)
            row.lps.append(choice.logprob)
            row.tops.append(choice.top)
            kept[b] += 1
    return kept
