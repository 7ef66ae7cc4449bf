"""Replay buffer of finished episodes with a joint SFT + RFT loss.

The buffer keeps whole :class:`~memrl.types.EpisodeTrajectory` objects (the raw "segments"). ``sample(n)``
returns ``(batch, targets, segments)``:

* ``batch`` — a :class:`~memrl.types.PackedBatch` of the sampled episodes' trainable steps;
* ``targets`` — :class:`ReplayTargets`, one reward per row;
* ``segments`` — the sampled episodes themselves. The SFT signal needs them: it is "the preferred output of
  the search", i.e. the best leaf of each tree / the highest-reward trajectory of each group, which can only be
  chosen by looking at the whole group, not at a single row.

:func:`replay_loss` = ``sft_weight · SFT + rft_weight · RFT`` where, per row with mean token log-prob ``ℓ``,
``SFT = -mean over SFT rows of ℓ`` (rows of each group's best episode, reward ≥ ``min_reward``, ties → first)
and ``RFT = -mean over rows of reward · ℓ``. When ``segments`` is ``None`` (a caller that only has the batch)
the loss warns once and trains without SFT, so replay still works on episodes stored without them.
"""

from __future__ import annotations

import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from memrl.train.config import TrainConfig
from memrl.train.losses import LOSS_AGGREGATIONS
from memrl.train.microbatch import forward_logits, split_micro_batches, token_logprobs, unpack
from memrl.types import EpisodeStatus, EpisodeTrajectory, PackedBatch

logger = logging.getLogger(__name__)

BuildBatch = Callable[[Sequence[EpisodeTrajectory]], PackedBatch]


@dataclass
class ReplayTargets:
    """``rewards`` ``[num_rows]``: the episode reward of each row of the sampled batch."""

    rewards: torch.Tensor


@dataclass
class ReplaySample:
    batch: PackedBatch
    targets: ReplayTargets
    segments: list[EpisodeTrajectory] | None

    def __iter__(self):  # so `batch, targets, segments = buffer.sample(n)` reads as the seed describes
        return iter((self.batch, self.targets, self.segments))


class ReplayBuffer:
    """FIFO store of episodes (``capacity`` episodes; the oldest are evicted first).

    ``build_batch`` turns episodes into a PackedBatch (the data layer's ``TrajectoryBatchBuilder.build``).
    Sampling draws whole groups, so each SFT target is chosen among all its siblings.
    """

    def __init__(self, capacity: int, build_batch: BuildBatch, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"ReplayBuffer capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.build_batch = build_batch
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
        """About ``batch_size`` episodes, drawn as whole groups (at least one group), without replacement."""
        if not self._episodes:
            raise ValueError("ReplayBuffer.sample: the buffer is empty; add episodes first")
        groups: dict[str, list[EpisodeTrajectory]] = {}
        for ep in self._episodes:
            groups.setdefault(ep.group_id, []).append(ep)
        order = list(groups)
        self._rng.shuffle(order)
        chosen: list[EpisodeTrajectory] = []
        for gid in order:
            if chosen and len(chosen) + len(groups[gid]) > batch_size:
                break
            chosen.extend(groups[gid])
        batch = self.build_batch(chosen)
        rewards = torch.as_tensor(batch.rewards, dtype=torch.float32).flatten()
        return ReplaySample(batch, ReplayTargets(rewards), chosen)

    def state_dict(self) -> dict:
        from memrl.types import to_dict

        return {"episodes": [to_dict(e) for e in self._episodes], "rng": self._rng.getstate()}

    def load_state_dict(self, state: dict) -> None:
        from memrl.types import episode_from_dict

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
    if segments is None:
        if not _warned_no_segments:
            logger.warning("replay sample has no segments: training on RFT only, SFT skipped")
            _warned_no_segments = True
        is_sft = torch.zeros(batch.num_steps)
    else:
        is_sft = sft_rows(batch, segments, rc.min_reward)
    coef = rc.sft_weight * is_sft + rc.rft_weight * targets.rewards
    ones = torch.ones(batch.num_steps)
    # The row coefficient rides in the advantage slot: loss_tok = -coef · logp, mean per sequence.
    records = unpack(batch, coef, ones)
    agg = LOSS_AGGREGATIONS.get("seq-mean-token-mean")
    micro = split_micro_batches(records, cfg.layout, cfg.micro_batch_tokens, cfg.micro_batch_size)
    total = max(sum(agg.count(mb.loss_mask, mb.seq_index) for mb in micro), 1.0)
    loss = torch.zeros(())
    for mb in micro:
        logp = token_logprobs(forward_logits(model, mb), mb.input_ids)
        part = (-mb.adv * logp * agg.weights(mb.loss_mask, mb.seq_index)).sum() / total
        part.backward()
        loss = loss + part.detach()
    metrics = {
        "replay/loss": float(loss),
        "replay/sft_rows": float(is_sft.sum()),
        "replay/rows": float(batch.num_steps),
        "replay/reward_mean": float(targets.rewards.mean()) if batch.num_steps else 0.0,
    }
    return loss, metrics
