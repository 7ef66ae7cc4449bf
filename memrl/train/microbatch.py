"""From a :class:`~memrl.types.PackedBatch` (either layout) to micro-batches, and the policy forward over them.

The update works on per-sequence records (:class:`SeqRecord`), so it accepts a batch in either layout, and
re-collates them into shared-prefix micro-batches: sequences with the same prompt (the ``n`` samples of a
chain, the leaves of a tree; they arrive adjacent) run the prompt once; its KV cache is repeated for the ``k``
responses, which are forwarded as a ``[k, R]`` right-padded block on top of it. Gradients flow through the
cache into the prompt's forward, so the result equals running each sequence in full, at about ``1/k`` of the
prompt cost. It is the trainer's only layout because GRPO groups share long prompts: padded rows forward every
prompt ``k`` times and a packed row's attention covers the whole row (``memrl bench batch`` compares them,
docs/benchmarks.md).
A micro-batch's aligned tensors cover ``[last prompt token, response...]`` (``[k, R + 1]``): prompt tokens
carry no loss. Rows whose prompts differ but start alike (memory writes and their instructions) are gathered the
same way over their longest common prefix, their differing prompt tails padded in the block
(:func:`collate_common`); the output layer then skips those tails (:func:`forward_logits`).

Every token-level tensor of a micro-batch is aligned with ``input_ids`` (position ``j`` describes token ``j``);
:func:`token_logprobs` returns ``log p(token_j | tokens_<j)`` at position ``j`` (0 at each sequence's first token,
which is always a prompt token and never trained on).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from memrl.data.batch import row_tensors
from memrl.types import PackedBatch


@dataclass
class SeqRecord:
    """One trainable sequence. ``ids`` = prompt + response ``[S]``; the rest are ``[S]`` aligned with ``ids``:
    ``loss_mask`` (response_mask × sample weight, 0 on the prompt), ``old_logp`` (behaviour log-probs, 0 on the
    prompt, NaN on a repaired call spliced in by a rollback) and ``adv`` (the sequence advantage on response tokens)."""

    ids: torch.Tensor
    prompt_len: int
    loss_mask: torch.Tensor
    old_logp: torch.Tensor
    adv: torch.Tensor
    index: int  # row in the source batch
    adapter: str = "default"  # the LoRA adapter that plays this row's role (memrl.train.lora.adapter_for)


@dataclass
class MicroBatch:
    """Right-padded rows: tensors ``[b, L]``, all aligned with ``input_ids``.

    ``seq_index`` gives each position's sequence number within the micro-batch (``-1`` on padding).
    ``num_seqs`` is the number of sequences; ``rows`` their indices in the source batch. ``prefix_ids`` is the
    prompt the rows share, minus its last token (``[1, P-1]``, forwarded once before them); ``None`` when the
    rows hold whole sequences (:func:`collate`). ``scored_from`` is the first position that holds a response
    token of some row: only positions from ``scored_from - 1`` on need logits (:func:`forward_logits`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    loss_mask: torch.Tensor
    old_logp: torch.Tensor
    adv: torch.Tensor
    seq_index: torch.Tensor
    num_seqs: int
    rows: list[int]
    prefix_ids: torch.Tensor | None = None
    scored_from: int = 1
    adapter: str = "default"  # every row's (a micro-batch never mixes adapters)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.numel())

    def to(self, device: torch.device | str) -> MicroBatch:
        """A copy with every tensor on ``device`` (the model's): micro-batches are built on the CPU from the
        batch, and the loss reads all of them beside the logits."""
        moved = {
            f.name: getattr(self, f.name).to(device)
            for f in fields(self)
            if isinstance(getattr(self, f.name), torch.Tensor)
        }
        return replace(self, **moved)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of ``model``'s parameters (a policy lives on one device)."""
    return next(model.parameters()).device


def _without_spliced_logprobs(old: torch.Tensor, meta) -> torch.Tensor:
    """NaN where a rollback spliced in a repaired call: those tokens were sampled under a context the final
    sequence no longer holds, so they have no behaviour log-prob here; the updater uses log-probs recomputed
    under the final context (see :class:`memrl.types.RollbackRecord`)."""
    spans = [
        (rb.position, rb.position + rb.repaired_tokens)
        for rb in getattr(meta, "rollbacks", ())
        if rb.repaired_tokens
    ]
    if not spans:
        return old.float()
    old = old.float().clone()
    for start, end in spans:
        old[start:end] = float("nan")
    return old


def seq_records(batch: PackedBatch, seq_adv: torch.Tensor, weights: torch.Tensor) -> list[SeqRecord]:
    """Split ``batch`` into sequences. ``seq_adv`` and ``weights`` are ``[num_steps]``."""
    out = []
    for i in range(batch.num_steps):
        prompt, resp, rmask, old, _ = row_tensors(batch, i)
        if len(prompt) == 0:
            raise ValueError(f"step {batch.step_ids[i]!r}: empty prompt (row {i}); every sequence needs one")
        old = _without_spliced_logprobs(old, batch.step_meta[i] if batch.step_meta else None)
        zeros = torch.zeros(len(prompt))
        mask = torch.cat([zeros, rmask.float() * float(weights[i])])
        out.append(
            SeqRecord(
                ids=torch.cat([prompt, resp]).long(),
                prompt_len=len(prompt),
                loss_mask=mask,
                old_logp=torch.cat([zeros, old]),
                adv=torch.cat([zeros, torch.full((len(resp),), float(seq_adv[i]))]),
                index=i,
            )
        )
    return out


def collate(records: Sequence[SeqRecord]) -> MicroBatch:
    """Records → one micro-batch of right-padded rows with an attention mask (no prefix sharing): the block
    :func:`collate_shared` puts on top of a shared prompt, and the reference it is checked against."""
    width = max(len(r.ids) for r in records)

    def pad(name: str, value: float = 0.0) -> torch.Tensor:
        rows = [F.pad(getattr(r, name), (0, width - len(r.ids)), value=value) for r in records]
        return torch.stack(rows)

    attn = torch.stack([(torch.arange(width) < len(r.ids)).long() for r in records])
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    seq_index = torch.where(attn.bool(), torch.arange(len(records)).unsqueeze(1), torch.full_like(attn, -1))
    return MicroBatch(
        pad("ids"), pos, attn, pad("loss_mask"), pad("old_logp"), pad("adv"), seq_index, len(records),
        [r.index for r in records], scored_from=max(1, min(r.prompt_len for r in records)),
        adapter=_one_adapter(records),
    )  # fmt: skip


def _one_adapter(records: Sequence[SeqRecord]) -> str:
    names = {r.adapter for r in records}
    if len(names) > 1:
        raise ValueError(f"a micro-batch mixes the rows of adapters {sorted(names)}; split them first")
    return names.pop()


def collate_shared(records: Sequence[SeqRecord]) -> MicroBatch:
    """Records with identical prompts → one shared-prefix micro-batch (tensors ``[k, R + 1]``)."""
    pl = records[0].prompt_len
    prompt = records[0].ids[:pl]
    for r in records[1:]:
        if r.prompt_len != pl or not torch.equal(r.ids[:pl], prompt):
            raise ValueError(
                f"shared_prefix micro-batch: row {r.index} has another prompt than row {records[0].index}"
            )
    tails = [
        SeqRecord(
            r.ids[pl - 1 :],
            1,
            r.loss_mask[pl - 1 :],
            r.old_logp[pl - 1 :],
            r.adv[pl - 1 :],
            r.index,
            r.adapter,
        )
        for r in records
    ]
    mb = collate(tails)
    mb.prefix_ids = prompt[: pl - 1].unsqueeze(0)
    mb.position_ids = mb.position_ids + (pl - 1)
    return mb


def collate_common(records: Sequence[SeqRecord]) -> MicroBatch:
    """Records whose prompts differ but start alike (memory writes share their instructions) → one micro-batch
    that forwards the longest common prefix once (at most every prompt minus its last token), then right-padded
    tails on top of it: the same logits as :func:`collate`, for one prefix forward instead of one per row."""
    first = records[0].ids
    p = min(r.prompt_len for r in records) - 1
    for r in records[1:]:
        same = (r.ids[:p] == first[:p]).long()
        p = int(same.cumprod(0).sum()) if p else 0
    if p <= 0:
        return collate(records)
    tails = [
        SeqRecord(r.ids[p:], r.prompt_len - p, r.loss_mask[p:], r.old_logp[p:], r.adv[p:], r.index, r.adapter)
        for r in records
    ]
    mb = collate(tails)
    mb.prefix_ids = first[:p].unsqueeze(0)
    mb.position_ids = mb.position_ids + p
    return mb


def _prompt_groups(records: Sequence[SeqRecord]) -> list[list[SeqRecord]]:
    """Consecutive runs of records with the same prompt (GRPO groups arrive adjacent)."""
    groups: list[list[SeqRecord]] = []
    for rec in records:
        last = groups[-1][0] if groups else None
        if (
            last is not None
            and last.prompt_len == rec.prompt_len
            and torch.equal(last.ids[: last.prompt_len], rec.ids[: rec.prompt_len])
        ):
            groups[-1].append(rec)
        else:
            groups.append([rec])
    return groups


# Rows of distinct prompts are batched over their common prefix only when it is at least this long: memory writes
# share a long block of instructions, so one forward of them replaces one per write; rows that share only the chat
# template's first tokens would pay more in padded tails than the prefix saves.
MIN_COMMON_PREFIX = 64


def split_micro_batches(records: Sequence[SeqRecord], max_rows: int) -> list[MicroBatch]:
    """One shared-prefix micro-batch per run of consecutive records with the same prompt, split into chunks of
    ≤ ``max_rows`` rows (``train.micro_batch_size``). Records whose prompt no neighbour shares (memory writes,
    demonstrations) are gathered with the others that start like them (≥ ``MIN_COMMON_PREFIX`` tokens) into
    common-prefix micro-batches (:func:`collate_common`); one that starts like no other is a micro-batch of one.
    Micro-batches come in the order of their first record, adapter by adapter (rows of different adapters never
    share one: each micro-batch runs with its own adapter active)."""
    adapters = list(dict.fromkeys(r.adapter for r in records))
    if len(adapters) > 1:
        return [
            mb
            for a in adapters
            for mb in split_micro_batches([r for r in records if r.adapter == a], max_rows)
        ]
    units: list[tuple[str, list[SeqRecord]]] = []
    open_runs: list[list[SeqRecord]] = []  # the singleton buckets, to find one a new singleton joins
    for group in _prompt_groups(records):
        if len(group) > 1:
            units.append(("shared", group))
            continue
        rec = group[0]
        bucket = next((b for b in open_runs if _common_len(b[0], rec) >= MIN_COMMON_PREFIX), None)
        if bucket is None:
            bucket = [rec]
            open_runs.append(bucket)
            units.append(("common", bucket))
        else:
            bucket.append(rec)
    out = []
    for kind, rows in units:
        for i in range(0, len(rows), max_rows):
            chunk = rows[i : i + max_rows]
            out.append(
                collate_shared(chunk) if kind == "shared" or len(chunk) == 1 else collate_common(chunk)
            )
    return out


def _common_len(a: SeqRecord, b: SeqRecord) -> int:
    """Length of the common start of two prompts (at most the shorter minus its last token, as collate_common)."""
    p = min(a.prompt_len, b.prompt_len) - 1
    if p <= 0:
        return 0
    return int((a.ids[:p] == b.ids[:p]).long().cumprod(0).sum())


def forward_logits(model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """``[b, N, V]`` logits of the last ``N`` positions, from ``scored_from - 1`` on (``N = L`` when every row's
    response starts at position 1): rows whose prompts are forwarded in the block (whole rows, common-prefix
    tails) skip the output layer on their prompt tokens, whose logits no loss reads (over SmolLM2's 49 K
    vocabulary that layer costs about as much as the rest of the model per token). ``use_cache=False`` on whole
    rows: a cache nobody reads would only cost memory."""
    keep = mb.input_ids.shape[1] - mb.scored_from + 1
    if mb.prefix_ids is not None and mb.prefix_ids.shape[1] > 0:
        return _shared_prefix_logits(model, mb, keep)
    # A one-token prompt leaves nothing to share: its rows are whole sequences.
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mb.attention_mask,
        position_ids=mb.position_ids,
        use_cache=False,
        logits_to_keep=keep,
    )
    return out.logits.float()


def _shared_prefix_logits(model: torch.nn.Module, mb: MicroBatch, keep: int) -> torch.Tensor:
    """Prompt (minus its last token) once with a cache, then the ``[k, R + 1]`` block on top of it."""
    k, width = mb.input_ids.shape
    p = mb.prefix_ids.shape[1]
    # One logit, not the prompt's: no loss reads the prefix's logits, and over a large vocabulary they cost as much
    # compute as the rest of the model, and on a long prompt more memory than the machine has.
    min_tokens = getattr(model, PROMPT_CHECKPOINT_ATTR, None)
    checkpointing = min_tokens is not None and p >= min_tokens and torch.is_grad_enabled()
    with checkpointed_layers(model) if checkpointing else contextlib.nullcontext():
        cache = model(input_ids=mb.prefix_ids, use_cache=True, logits_to_keep=1).past_key_values
    cache.batch_repeat_interleave(k)
    prefix_mask = torch.ones(k, p, dtype=mb.attention_mask.dtype, device=mb.attention_mask.device)
    mask = torch.cat([prefix_mask, mb.attention_mask], dim=1)
    out = model(
        input_ids=mb.input_ids,
        attention_mask=mask,
        position_ids=mb.position_ids,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=keep,
    )
    return out.logits.float()


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``logits [b, N, V]`` of the last ``N ≤ L`` positions, ``input_ids [b, L]`` → ``[b, L]`` log p(token_j | <j);
    the positions no logit predicts (position 0, and the first ``L - N`` more) get 0."""
    skip = input_ids.shape[1] - logits.shape[1] + 1
    targets = input_ids[:, skip:].unsqueeze(-1)
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, targets).squeeze(-1)
    return F.pad(logp, (skip, 0))


def token_entropy(logits: torch.Tensor, length: int | None = None) -> torch.Tensor:
    """``[b, N, V]`` logits of the last ``N`` of ``length`` positions (default ``N``) → ``[b, length]`` entropy of
    the distribution that predicts token j (0 where no logit predicts it, as :func:`token_logprobs`)."""
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return F.pad(ent, ((length or logits.shape[1]) - logits.shape[1] + 1, 0))


# Prompts of at least this many tokens (an attribute set on the model, train.checkpoint_prompt_tokens) are forwarded
# with activation checkpointing, layer by layer.
PROMPT_CHECKPOINT_ATTR = "memrl_checkpoint_prompt_tokens"


def checkpoint_prompts(model: torch.nn.Module, min_tokens: int | None) -> None:
    """Forward shared prompts of ≥ ``min_tokens`` tokens under :func:`checkpointed_layers` (None: never)."""
    if min_tokens is None:
        model.__dict__.pop(PROMPT_CHECKPOINT_ATTR, None)
    else:
        setattr(model, PROMPT_CHECKPOINT_ATTR, min_tokens)


class _KVRecorder:
    """Stands in for the cache inside one checkpointed layer: the layer's attention hands it the prompt's keys and
    values (its only call on a cache), which it keeps and returns as they are (the prompt has no past)."""

    def __init__(self) -> None:
        self.kv: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args, **kwargs):
        self.kv = (key, value)
        return key, value


@contextlib.contextmanager
def checkpointed_layers(model: torch.nn.Module) -> Iterator[None]:
    """Within the block, each decoder layer that receives a cache runs under (non-reentrant) activation
    checkpointing: only its input is kept for the backward pass, which recomputes the layer. Backpropagating
    through a long prompt (a LoCoMo one) otherwise keeps every layer's activations, more than a CPU machine has
    beside the rollout. transformers' own checkpointing drops the cache, which the
    responses on top of the prompt need, so the layer writes its keys and values into a stand-in
    (:class:`_KVRecorder`) inside the checkpoint, and they go into the real cache outside it: a recompute in the
    backward pass then leaves the cache alone. Exact: the gradients are those of the plain forward."""
    layers = [m for m in model.modules() if hasattr(getattr(m, "self_attn", None), "layer_idx")]
    if not layers:
        raise TypeError(
            f"{type(model).__name__} has no decoder layers with self_attn.layer_idx to checkpoint"
        )
    own = [
        layer.__dict__.get("forward") for layer in layers
    ]  # a forward set on the instance (hooks), else None
    for layer in layers:
        layer.forward = _checkpointed_forward(layer, layer.forward)
    try:
        yield
    finally:
        for layer, forward in zip(layers, own, strict=True):
            if forward is None:
                del layer.forward  # the class's forward shows through again
            else:
                layer.forward = forward


def _checkpointed_forward(layer: torch.nn.Module, forward):
    idx = layer.self_attn.layer_idx

    def run(hidden_states, *args, past_key_values=None, **kwargs):
        if past_key_values is None:
            return forward(hidden_states, *args, **kwargs)
        if past_key_values.get_seq_length(idx) != 0:
            raise RuntimeError(
                f"layer {idx}: checkpointing only covers a prompt forwarded with an empty cache"
            )

        def inner(h):
            rec = _KVRecorder()
            out = forward(h, *args, past_key_values=rec, **kwargs)
            if rec.kv is None:
                raise RuntimeError(f"layer {idx} did not write its keys and values into the cache")
            return out, *rec.kv

        out, key, value = checkpoint(inner, hidden_states, use_reentrant=False)
        past_key_values.update(key, value, idx)
        return out

    return run
