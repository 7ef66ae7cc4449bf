"""Replay buffer of finished episodes with a joint SFT + RFT loss.

The buffer keeps whole :class:`~memrl.types.EpisodeTrajectory` objects (the raw "segments"). ``sample(n)``
returns ``(batch, targets, segments)``:

* ``batch`` — a :class:`~memrl.types.PackedBatch` of the sampled episodes' trainable steps;
* ``targets`` — :class:`ReplayTargets`, one reward per row;
* ``segments`` — the sampled episodes themselves. The SFT signal needs them: it is "the preferred output of
  the search", i.e. the best leaf of each tree / the highest-reward trajectory of each group, which can only be
  chosen by looking at the whole group, not at a single row.

With a ``demonstrate`` function (``train.replay.demonstrations: gold``, :mod:`memrl.train.demonstrations`) a
sampled group whose best episode is below ``min_reward`` also gets a demonstration, placed right after the group
in ``batch`` (so a shared-prefix micro-batch forwards the prompt once for both) and listed in
``ReplaySample.demonstrations``; it is that group's SFT target and never an RFT row.

:func:`replay_loss` = ``sft_weight · SFT + rft_weight · RFT`` where, per row with mean token log-prob ``ℓ``,
``SFT = -mean over SFT rows of ℓ`` (rows of each group's best episode, reward ≥ ``min_reward``, ties → first;
else the group's demonstration) and ``RFT = -mean over rows of reward · ℓ`` (demonstrations excluded); both means
divide by the number of rows. Rows whose coefficient is 0 add nothing and are not forwarded. When ``segments`` is ``None`` (a caller that only has the batch)
the loss warns once and trains without SFT, so replay still works on episodes stored without them.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from memrl.train.config import TrainConfig
from memrl.train.lora import use_adapter
from memrl.train.losses import LOSS_AGGREGATIONS
from memrl.train.microbatch import (
    MicroBatch,
    SeqRecord,
    forward_logits,
    model_device,
    seq_records,
    split_micro_batches,
    token_logprobs,
)
from memrl.train.roles import label_adapters, step_role
from memrl.types import EpisodeStatus, EpisodeTrajectory, PackedBatch

logger = logging.getLogger(__name__)

BuildBatch = Callable[[Sequence[EpisodeTrajectory]], PackedBatch]
# A group's demonstration (an off-policy SFT target), or None when it needs none.
Demonstrate = Callable[[Sequence[EpisodeTrajectory]], EpisodeTrajectory | None]


@dataclass
class ReplayTargets:
    """``rewards`` ``[num_rows]``: the episode reward of each row of the sampled batch."""

    rewards: torch.Tensor


@dataclass
class ReplaySample:
    batch: PackedBatch
    targets: ReplayTargets
    segments: list[EpisodeTrajectory] | None
    demonstrations: list[EpisodeTrajectory] = field(default_factory=list)  # rows of ``batch``, not segments
    # The roles trained this step (``train.roles``, by phase): rows of another role get no coefficient, so a
    # writer kept as the warm start left it is not trained on its own replayed writes. None: every row.
    roles: tuple[str, ...] | None = None

    def __iter__(self):  # so `batch, targets, segments = buffer.sample(n)` reads as the seed describes
        return iter((self.batch, self.targets, self.segments))


class ReplayBuffer:
    """FIFO store of episodes (``capacity`` episodes; the oldest are evicted first).

    ``build_batch`` turns episodes into a PackedBatch (the data layer's ``TrajectoryBatchBuilder.build``).
    Sampling draws whole groups, so each SFT target is chosen among all its siblings. ``demonstrate`` (optional)
    gives a sampled group its demonstration; demonstrations are derived at sampling time, never stored.
    """

    def __init__(
        self, capacity: int, build_batch: BuildBatch, seed: int = 0, demonstrate: Demonstrate | None = None
    ) -> None:
        if capacity < 1:
            raise ValueError(f"ReplayBuffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.build_batch = build_batch
        self.demonstrate = demonstrate
        self._episodes: deque[EpisodeTrajectory] = deque()
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self._episodes)

    def add(self, episodes: Sequence[EpisodeTrajectory]) -> None:
        """Store trainable episodes (failed / aborted ones carry no usable signal and are not stored)."""
        for ep in episodes:
            if ep.status in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED) and any(
                s.trainable for s in ep.steps
            ):
                self._episodes.append(ep)
        while len(self._episodes) > self.capacity:
            self._episodes.popleft()

    def sample(self, batch_size: int) -> ReplaySample:
        """About ``batch_size`` episodes, drawn as whole groups (at least one group), without replacement, plus
        their groups' demonstrations (not counted in ``batch_size``)."""
        if not self._episodes:
            raise ValueError("ReplayBuffer.sample: the buffer is empty; add episodes first")
        groups: dict[str, list[EpisodeTrajectory]] = {}
        for ep in self._episodes:
            groups.setdefault(ep.group_id, []).append(ep)
        order = list(groups)
        self._rng.shuffle(order)
        chosen: list[EpisodeTrajectory] = []
        rows: list[EpisodeTrajectory] = []
        demos: list[EpisodeTrajectory] = []
        for gid in order:
            if chosen and len(chosen) + len(groups[gid]) > batch_size:
                break
            chosen.extend(groups[gid])
            rows.extend(groups[gid])
            demo = self.demonstrate(groups[gid]) if self.demonstrate is not None else None
            if demo is not None:
                demos.append(demo)
                rows.append(demo)
        batch = self.build_batch(rows)
        rewards = torch.as_tensor(batch.rewards, dtype=torch.float32).flatten()
        return ReplaySample(batch, ReplayTargets(rewards), chosen, demos)

    def state_dict(self) -> dict:
        from memrl.serialize import to_dict

        return {"episodes": [to_dict(e) for e in self._episodes], "rng": self._rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        from memrl.serialize import episode_from_dict

        self._episodes = deque(episode_from_dict(e) for e in state["episodes"])
        rng = state["rng"]
        self._rng.setstate((rng[0], tuple(rng[1]), rng[2]))


def sft_rows(batch: PackedBatch, segments: Sequence[EpisodeTrajectory], min_reward: float) -> torch.Tensor:
    """``[num_rows]`` 1.0 on rows whose episode is its group's best (reward ≥ ``min_reward``), else 0.0."""
    best: dict[str, EpisodeTrajectory] = {}
    for ep in segments:
        if ep.reward >= min_reward and (ep.group_id not in best or ep.reward > best[ep.group_id].reward):
            best[ep.group_id] = ep
    chosen = {ep.episode_id for ep in best.values()}
    return torch.tensor([1.0 if eid in chosen else 0.0 for eid in batch.episode_ids])


_warned_no_segments = False


def replay_loss(model: torch.nn.Module, sample: ReplaySample, cfg: TrainConfig) -> tuple[torch.Tensor, dict]:
    """Backward-ready joint loss (already normalised) and metrics ``replay/...``. Gradients flow through the
    adapter only. Rows are weighted by ``sft_weight·is_best + rft_weight·reward`` (one coefficient per row)."""
    global _warned_no_segments
    batch, targets, segments = sample
    rc = cfg.replay
    demo_ids = {d.episode_id for d in sample.demonstrations}
    is_demo = torch.tensor([float(eid in demo_ids) for eid in batch.episode_ids])
    if segments is None:
        if not _warned_no_segments:
            logger.warning("replay sample has no segments: training on RFT only, SFT skipped")
            _warned_no_segments = True
        is_sft = is_demo
    else:
        is_sft = torch.maximum(sft_rows(batch, segments, rc.min_reward), is_demo)
    if sample.roles is not None and batch.step_meta:  # rows of a role not trained this step: no coefficient
        in_role = torch.tensor([float(step_role(m) in sample.roles) for m in batch.step_meta])
        is_sft, is_demo = is_sft * in_role, is_demo * in_role
        rewards = targets.rewards * in_role
    else:
        rewards = targets.rewards
    coef = rc.sft_weight * is_sft + rc.rft_weight * rewards * (1.0 - is_demo)
    # The row coefficient rides in the advantage slot: loss_tok = -coef · logp, mean per sequence.
    records = seq_records(batch, coef, torch.ones(batch.num_steps))
    label_adapters(records, batch.step_meta, model)
    agg = LOSS_AGGREGATIONS.get("seq-mean-token-mean")
    device = model_device(model)

    def split(recs: Sequence[SeqRecord]) -> list[MicroBatch]:
        return [mb.to(device) for mb in split_micro_batches(recs, cfg.micro_batch_size)]

    # The normaliser counts every row, so skipping the forward of coefficient-0 rows leaves the loss unchanged.
    total = max(sum(agg.count(mb.loss_mask, mb.seq_index) for mb in split(records)), 1.0)
    loss, demo_logp, demo_tokens = torch.zeros(()), 0.0, 0.0
    for mb in split([r for r in records if float(coef[r.index]) != 0.0]):
        with use_adapter(model, mb.adapter):
            logp = token_logprobs(forward_logits(model, mb), mb.input_ids)
            part = (-mb.adv * logp * agg.weights(mb.loss_mask, mb.seq_index)).sum() / total
            part.backward()
        loss = loss + part.detach()
        on_demo = is_demo.to(device)[torch.tensor(mb.rows, device=device)][mb.seq_index.clamp(min=0)]
        on_demo = on_demo * (mb.loss_mask > 0)
        demo_logp += float((logp.detach() * on_demo).sum())
        demo_tokens += float(on_demo.sum())
    real = 1.0 - is_demo
    metrics = {
        "replay/loss": float(loss),
        "replay/sft_rows": float(is_sft.sum()),
        "replay/demo_rows": float(is_demo.sum()),
        "replay/rows": float(batch.num_steps),
        "replay/reward_mean": float((targets.rewards * real).sum() / real.sum()) if real.sum() else 0.0,
    }
    if demo_tokens:  # how likely the policy finds the demonstrated answer (rises as it learns the format)
        metrics["replay/demo_token_logp"] = demo_logp / demo_tokens
    return loss, metrics
