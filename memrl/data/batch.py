"""TrajectoryBatchBuilder: finished episodes → training tensors (padded as verl, or packed without padding).

Rows are the episodes' steps in order. Target-turn steps are trainable, and so are memory writes the policy made
(``memory.extractor: policy``) that carry a step credit: such a row keeps its mask and log-probs, its reward is
the step's credit (``step_rewards_ext``) and its group is ``StepMeta.credit_group``
(:mod:`memrl.episode.credit`). Other history-turn steps are dropped (``untrained_steps="drop"``) or kept
with ``response_mask`` 0 and reward 0 (``"mask"``). The episode reward is broadcast to every target step of that
episode: ``rewards[i]`` is the row's scalar and ``token_level_rewards``
holds it on the row's last response token with mask 1 (verl's outcome-reward convention), 0 elsewhere.
``step_meta`` / ``step_rewards_ext`` / ids are sidecars aligned 1:1 with rows.

Layouts (a registry, :data:`LAYOUTS`):

* ``padded`` — verl's layout. With ``P = max prompt`` and ``R = max response`` length:
  ``prompts [N, P]`` (left-padded), ``responses``/``response_mask``/``old_log_probs``/``token_level_rewards``
  ``[N, R]`` (right-padded), ``input_ids``/``attention_mask``/``position_ids`` ``[N, P + R]`` with
  ``position_ids = clip(cumsum(attention_mask) - 1, 0)``.
* ``packed`` — no padding: every per-token tensor is ``[1, T]`` with ``T = Σ (prompt_i + response_i)``,
  ``cu_seqlens [N + 1]`` int32, position ids restart at 0 per sequence, response-side tensors are aligned
  with ``input_ids`` (0 on prompt tokens).

A batch is the trainer's input and the export format for verl (:func:`memrl.data.dataproto.to_dataproto`). The
trainer reads it back row by row (:func:`row_tensors`, via :func:`memrl.train.microbatch.seq_records`) and
lays the rows out as shared-prefix micro-batches itself, so the batch layout does not change what or how fast it
trains.

    >>> batch = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(episodes)
    >>> [s.step_id for s in unpack_steps(batch)] == batch.step_ids
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from memrl.data.config import BatchConfig
from memrl.registry import Registry
from memrl.types import EpisodeStatus, EpisodeTrajectory, PackedBatch, StepMeta, TurnRole

logger = logging.getLogger(__name__)

# Episodes in these states have not finished: training on them would train on a partial trajectory.
UNFINISHED = (EpisodeStatus.PENDING, EpisodeStatus.ABORTED)


class BatchError(ValueError):
    """A trajectory cannot become a training row; the message names the step id."""


class UnpackedStep(NamedTuple):
    """One row read back from a batch (the identity test compares these with the source steps)."""

    step_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    logprobs: tuple[float, ...]


@dataclass(frozen=True)
class BatchRow:
    """One row before tensorisation: the (possibly truncated) token lists plus its reward and sidecars."""

    step_id: str
    episode_id: str
    group_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    reward: float
    meta: StepMeta
    reward_ext: float | None = None
    truncated: bool = False


LayoutFn = Callable[[Sequence[BatchRow], int], PackedBatch]
LAYOUTS: Registry[LayoutFn] = Registry("batch layout")


# -- episodes → rows ------------------------------------------------------------------------------------------


def _fit(row: BatchRow, config: BatchConfig) -> BatchRow:
    """Apply the length limits: raise, or cut and flag the row (never silently)."""
    cut = {}
    p_max, r_max = config.max_prompt_len, config.max_response_len
    if p_max is not None and len(row.prompt_ids) > p_max:
        # The target prompt ends with the question, so keep its tail.
        cut["prompt_ids"] = row.prompt_ids[-p_max:]
    if r_max is not None and len(row.response_ids) > r_max:
        cut.update(
            response_ids=row.response_ids[:r_max],
            response_mask=row.response_mask[:r_max],
            logprobs=row.logprobs[:r_max],
        )
    if not cut:
        return row
    if config.on_overflow == "raise":
        raise BatchError(
            f"step {row.step_id!r} (episode {row.episode_id!r}): prompt {len(row.prompt_ids)} / response "
            f"{len(row.response_ids)} tokens exceed data.batch.max_prompt_len={p_max} / max_response_len="
            f"{r_max}; raise the limits or set data.batch.on_overflow=truncate"
        )
    logger.warning("step %s truncated to the batch length limits", row.step_id)
    return dataclasses.replace(row, **cut, truncated=True)


def rows_from_episodes(episodes: Sequence[EpisodeTrajectory], config: BatchConfig) -> list[BatchRow]:
    """Flatten episodes into rows: target steps get the episode reward, history steps are dropped or masked."""
    rows: list[BatchRow] = []
    for ep in episodes:
        if not isinstance(ep, EpisodeTrajectory):
            raise TypeError(f"expected EpisodeTrajectory, got {type(ep).__name__}")
        if ep.status in UNFINISHED:
            raise BatchError(
                f"episode {ep.episode_id!r} is {ep.status.value}: only finished episodes can be trained on; "
                "re-run it (RolloutBuffer.add_samples) or filter it out before building the batch"
            )
        for j, step in enumerate(ep.steps):
            ext = ep.step_rewards_ext[j] if ep.step_rewards_ext else None
            is_target = step.turn_role is TurnRole.TARGET
            # A memory write with credit is trained on its own reward and group (memrl.episode.credit).
            is_write = not is_target and ext is not None and step.meta.credit_group is not None
            if not (is_target or is_write) and config.untrained_steps == "drop":
                continue
            trained = is_target or is_write
            row = BatchRow(
                step_id=step.step_id,
                episode_id=ep.episode_id,
                group_id=step.meta.credit_group if is_write else ep.group_id,
                prompt_ids=step.prompt_ids,
                response_ids=step.response_ids,
                response_mask=step.response_mask if trained else (0,) * len(step.response_ids),
                logprobs=step.logprobs,
                reward=float(ep.reward) if is_target else (float(ext) if is_write else 0.0),
                meta=step.meta,
                reward_ext=ext,
                truncated=ep.status is EpisodeStatus.TRUNCATED and is_target,
            )
            rows.append(_fit(row, config))
    if not rows:
        raise BatchError(
            f"no rows to train on: {len(episodes)} episodes gave no target-turn steps "
            f"(untrained_steps={config.untrained_steps!r})"
        )
    return rows


def _sidecars(rows: Sequence[BatchRow]) -> dict:
    return {
        "rewards": torch.tensor([r.reward for r in rows], dtype=torch.float32),
        "prompt_lengths": torch.tensor([len(r.prompt_ids) for r in rows], dtype=torch.long),
        "response_lengths": torch.tensor([len(r.response_ids) for r in rows], dtype=torch.long),
        "truncated": torch.tensor([r.truncated for r in rows], dtype=torch.bool),
        "group_ids": [r.group_id for r in rows],
        "episode_ids": [r.episode_id for r in rows],
        "step_ids": [r.step_id for r in rows],
        "step_meta": [r.meta for r in rows],
        "step_rewards_ext": [r.reward_ext for r in rows],
    }


def _last_trained(mask: Sequence[int]) -> int | None:
    """Index of the last response token with mask 1 (where the outcome reward sits), None if none."""
    for k in range(len(mask) - 1, -1, -1):
        if mask[k]:
            return k
    return None


# -- layouts ----------------------------------------------------------------------------------------------------


@LAYOUTS.register("padded")
def build_padded(rows: Sequence[BatchRow], pad_token_id: int = 0) -> PackedBatch:
    """verl layout: prompts left-padded to ``P``, responses right-padded to ``R``; tensors ``[N, P + R]``."""
    n = len(rows)
    p_max = max(len(r.prompt_ids) for r in rows)
    r_max = max(len(r.response_ids) for r in rows)
    prompts = np.full((n, p_max), pad_token_id, dtype=np.int64)
    responses = np.full((n, r_max), pad_token_id, dtype=np.int64)
    prompt_attn = np.zeros((n, p_max), dtype=np.int64)
    resp_attn = np.zeros((n, r_max), dtype=np.int64)
    resp_mask = np.zeros((n, r_max), dtype=np.int64)
    logprobs = np.zeros((n, r_max), dtype=np.float32)
    tl_rewards = np.zeros((n, r_max), dtype=np.float32)
    for i, r in enumerate(rows):
        p, m = len(r.prompt_ids), len(r.response_ids)
        prompts[i, p_max - p :] = r.prompt_ids
        prompt_attn[i, p_max - p :] = 1
        responses[i, :m] = r.response_ids
        resp_attn[i, :m] = 1
        resp_mask[i, :m] = r.response_mask
        logprobs[i, :m] = r.logprobs
        last = _last_trained(r.response_mask)
        if last is not None:
            tl_rewards[i, last] = r.reward
    attention_mask = torch.from_numpy(np.concatenate([prompt_attn, resp_attn], axis=1))
    return PackedBatch(
        layout="padded",
        prompts=torch.from_numpy(prompts),
        input_ids=torch.from_numpy(np.concatenate([prompts, responses], axis=1)),
        attention_mask=attention_mask,
        position_ids=torch.clip(torch.cumsum(attention_mask, dim=-1) - 1, min=0),
        responses=torch.from_numpy(responses),
        response_mask=torch.from_numpy(resp_mask),
        token_level_rewards=torch.from_numpy(tl_rewards),
        old_log_probs=torch.from_numpy(logprobs),
        **_sidecars(rows),
    )


@LAYOUTS.register("packed")
def build_packed(rows: Sequence[BatchRow], pad_token_id: int = 0) -> PackedBatch:
    """No padding: ``[1, T]`` tensors, ``cu_seqlens [N + 1]``, position ids restarting at 0 per sequence."""
    del pad_token_id  # nothing is padded
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in rows]
    cu = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=cu[1:])
    total = int(cu[-1])
    input_ids = np.zeros(total, dtype=np.int64)
    position_ids = np.zeros(total, dtype=np.int64)
    responses = np.zeros(total, dtype=np.int64)
    resp_mask = np.zeros(total, dtype=np.int64)
    logprobs = np.zeros(total, dtype=np.float32)
    tl_rewards = np.zeros(total, dtype=np.float32)
    for i, r in enumerate(rows):
        start, p, m = int(cu[i]), len(r.prompt_ids), len(r.response_ids)
        rs = start + p  # first response token
        input_ids[start:rs] = r.prompt_ids
        input_ids[rs : rs + m] = r.response_ids
        position_ids[start : rs + m] = np.arange(p + m)
        responses[rs : rs + m] = r.response_ids
        resp_mask[rs : rs + m] = r.response_mask
        logprobs[rs : rs + m] = r.logprobs
        last = _last_trained(r.response_mask)
        if last is not None:
            tl_rewards[rs + last] = r.reward
    as_row = lambda a: torch.from_numpy(a).unsqueeze(0)  # noqa: E731 - [T] -> [1, T]
    return PackedBatch(
        layout="packed",
        input_ids=as_row(input_ids),
        attention_mask=torch.ones(1, total, dtype=torch.long),
        position_ids=as_row(position_ids),
        responses=as_row(responses),
        response_mask=as_row(resp_mask),
        token_level_rewards=as_row(tl_rewards),
        old_log_probs=as_row(logprobs),
        cu_seqlens=torch.from_numpy(cu.astype(np.int32)),
        **_sidecars(rows),
    )


# -- reading batches back ----------------------------------------------------------------------------------------


class RowTensors(NamedTuple):
    """One row of a batch, in either layout, as 1-D tensors without padding."""

    prompt_ids: torch.Tensor
    response_ids: torch.Tensor
    response_mask: torch.Tensor
    logprobs: torch.Tensor
    token_level_rewards: torch.Tensor


def row_tensors(batch: PackedBatch, i: int) -> RowTensors:
    """Row ``i`` of ``batch`` (either layout): the one reader of a batch's rows, for unpacking and training."""
    p, m = int(batch.prompt_lengths[i]), int(batch.response_lengths[i])
    if batch.layout == "packed":
        start = int(batch.cu_seqlens[i])
        rs, end = start + p, int(batch.cu_seqlens[i + 1])
        if end - start != p + m:
            raise BatchError(
                f"step {batch.step_ids[i]!r}: cu_seqlens gives {end - start} tokens but prompt+response "
                f"lengths are {p}+{m}"
            )
        return RowTensors(
            batch.input_ids[0, start:rs],
            batch.input_ids[0, rs:end],
            batch.response_mask[0, rs:end],
            batch.old_log_probs[0, rs:end],
            batch.token_level_rewards[0, rs:end],
        )
    p_max = batch.prompts.shape[1]
    return RowTensors(
        batch.prompts[i, p_max - p :],
        batch.responses[i, :m],
        batch.response_mask[i, :m],
        batch.old_log_probs[i, :m],
        batch.token_level_rewards[i, :m],
    )


def unpack_steps(batch: PackedBatch) -> list[UnpackedStep]:
    """Read every row back as token lists (either layout); packing then unpacking is the identity."""
    out = []
    for i, step_id in enumerate(batch.step_ids):
        prompt, resp, mask, lps, _ = row_tensors(batch, i)
        out.append(
            UnpackedStep(
                step_id=step_id,
                prompt_ids=tuple(prompt.tolist()),
                response_ids=tuple(resp.tolist()),
                response_mask=tuple(mask.tolist()),
                logprobs=tuple(lps.tolist()),
            )
        )
    return out


def validate_batch(batch: PackedBatch) -> None:
    """Check that loss mask, rewards and response lengths agree; raise :class:`BatchError` naming the step."""
    if batch.layout == "padded":
        m_max = batch.response_mask.shape[1]
        lengths = batch.response_lengths.unsqueeze(1)
        outside = torch.arange(m_max).unsqueeze(0) >= lengths  # [N, R] padding positions
        resp_attn = batch.attention_mask[:, batch.prompts.shape[1] :]
        bad = (batch.response_mask.bool() & outside).any(1) | (batch.token_level_rewards.ne(0) & outside).any(
            1
        )
        bad |= resp_attn.sum(1) != batch.response_lengths
        for i in torch.nonzero(bad).flatten().tolist():
            raise BatchError(
                f"step {batch.step_ids[i]!r}: response_mask/rewards/attention extend past its response length "
                f"{int(batch.response_lengths[i])}"
            )
    else:
        total = int(batch.cu_seqlens[-1])
        if batch.input_ids.shape[-1] != total:
            raise BatchError(
                f"packed batch: input_ids has {batch.input_ids.shape[-1]} tokens, cu_seqlens {total}"
            )
        for i in range(batch.num_steps):
            row_tensors(batch, i)  # raises on a length mismatch
        in_prompt = batch.responses.new_ones(total, dtype=torch.bool)
        for i in range(batch.num_steps):
            rs = int(batch.cu_seqlens[i]) + int(batch.prompt_lengths[i])
            in_prompt[rs : int(batch.cu_seqlens[i + 1])] = False
        bad = in_prompt & (batch.response_mask[0].bool() | batch.token_level_rewards[0].ne(0))
        if bad.any():
            pos = int(torch.nonzero(bad)[0])
            i = (
                int(torch.searchsorted(batch.cu_seqlens, torch.tensor(pos, dtype=torch.int32), right=True))
                - 1
            )
            raise BatchError(f"step {batch.step_ids[i]!r}: response_mask/rewards set on a prompt token")


def rows_from_batch(batch: PackedBatch) -> list[BatchRow]:
    """Rows of an existing batch (for re-layout or micro-batching); rewards are read from ``rewards``."""
    rows = []
    for i, step in enumerate(unpack_steps(batch)):
        rows.append(
            BatchRow(
                step_id=step.step_id,
                episode_id=batch.episode_ids[i],
                group_id=batch.group_ids[i],
                prompt_ids=step.prompt_ids,
                response_ids=step.response_ids,
                response_mask=step.response_mask,
                logprobs=step.logprobs,
                reward=float(batch.rewards[i]),
                meta=batch.step_meta[i],
                reward_ext=batch.step_rewards_ext[i],
                truncated=bool(batch.truncated[i]) if batch.truncated is not None else False,
            )
        )
    return rows


def select_steps(batch: PackedBatch, indices: Sequence[int], layout: str | None = None) -> PackedBatch:
    """A new batch of the given rows (in that order), in ``layout`` (default: the batch's own)."""
    rows = rows_from_batch(batch)
    return LAYOUTS.get(layout or batch.layout)([rows[i] for i in indices])


class TrajectoryBatchBuilder:
    """Builds :class:`PackedBatch` objects from finished episodes (see the module docstring for the layouts)."""

    def __init__(self, config: BatchConfig | None = None) -> None:
        self.config = config or BatchConfig()
        self._layout = LAYOUTS.get(self.config.layout)

    def build(self, episodes: Sequence[EpisodeTrajectory], layout: str | None = None) -> PackedBatch:
        rows = rows_from_episodes(episodes, self.config)
        build = LAYOUTS.get(layout) if layout is not None else self._layout
        batch = build(rows, self.config.pad_token_id)
        validate_batch(batch)
        return batch
