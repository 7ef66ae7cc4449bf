"""CustomRolloutWorker: run episodes locally or sharded over Ray actors.

Local: one :class:`EpisodeRunner` in this process; inputs are cut into chunks of ``episode.batch_size`` that
each advance together.

Ray (``episode.worker.use_ray``): ``num_workers`` actors, each holding its own policy backend and memory
system. A batch is cut into contiguous shards (one per actor, or smaller if ``batch_size`` asks); results are
gathered **in input order**. If an actor dies mid-batch (``RayActorError``), a replacement actor is started and
the shard is re-run there — each shard's result is accepted exactly once, so no episode is lost or duplicated;
a shard that kills ``max_attempts`` actors fails the batch with a typed :class:`WorkerLostError`.

    worker = CustomRolloutWorker(cfg)            # cfg: memrl.config.Config
    trajectories = worker.run_batch(batch_inputs)
    worker.close()
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.config import Config
from memrl.types import BatchInput, EpisodeTrajectory

logger = logging.getLogger(__name__)


class WorkerLostError(RuntimeError):
    """A shard's actor died ``max_attempts`` times; its episodes could not be run."""


def _chunks(items: Sequence[Any], size: int) -> list[list[Any]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def check_complete(inputs: Sequence[BatchInput], trajs: Sequence[EpisodeTrajectory]) -> None:
    """Every input produced trajectories, in input order, and nothing else (no loss, no duplicate)."""
    order = list(dict.fromkeys(t.source_episode_id for t in trajs))
    expected = [bi.episode_id for bi in inputs]
    if order != expected:
        missing = sorted(set(expected) - set(order))
        extra = sorted(set(order) - set(expected))
        raise WorkerLostError(
            f"episode results do not match inputs: missing {missing[:5]}, unexpected {extra[:5]}, "
            f"order ok={sorted(order) == sorted(expected)}"
        )


class LocalRolloutWorker:
    """Runs episodes in this process with one :class:`EpisodeRunner` (built on first use)."""

    def __init__(self, cfg: Config, *, policy: Any = None, runner: Any = None) -> None:
        self.cfg = cfg
        self._policy = policy
        self._runner = runner

    @property
    def runner(self) -> Any:
        if self._runner is None:
            from memrl.episode.build import build_runner

            self._runner = build_runner(self.cfg, policy=self._policy)
        return self._runner

    def run_batch(self, inputs: Sequence[BatchInput]) -> list[EpisodeTrajectory]:
        out: list[EpisodeTrajectory] = []
        for chunk in _chunks(list(inputs), self.cfg.episode.batch_size):
            out.extend(self.runner.run_batch(chunk))
        return out

    def metrics(self) -> dict[str, float]:
        return self.runner.snapshot_metrics() if self._runner is not None else {}

    def close(self) -> None:
        tools = getattr(self._runner, "tools", None)
        if tools is not None and hasattr(tools, "close"):
            tools.close()


class _EpisodeActor:
    """Ray actor body: a LocalRolloutWorker in the actor process."""

    def __init__(self, cfg: Config) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.worker = LocalRolloutWorker(cfg)

    def run(self, inputs: list[BatchInput]) -> list[EpisodeTrajectory]:
        return self.worker.run_batch(inputs)

    def metrics(self) -> dict[str, float]:
        return self.worker.metrics()

    def pid(self) -> int:
        return os.getpid()


@dataclass
class _Shard:
    index: int
    inputs: list[BatchInput]
    attempts: int = 0
    result: list[EpisodeTrajectory] | None = None


@dataclass
class PendingBatch:
    """A submitted batch: shards in flight. Pass to :meth:`RayRolloutWorker.gather`."""

    inputs: list[BatchInput]
    shards: list[_Shard]
    # ObjectRef → (shard, actor slot, actor handle it was sent to)
    inflight: dict[Any, tuple[_Shard, int, Any]] = field(default_factory=dict)


class RayRolloutWorker:
    """``num_workers`` Ray actors; episodes sharded across them; actor loss → shard re-run elsewhere."""

    def __init__(self, cfg: Config) -> None:
        import ray

        self.cfg = cfg
        wcfg = cfg.episode.worker
        if not ray.is_initialized():
            ray.init(address=wcfg.ray_address, include_dashboard=False, ignore_reinit_error=True)
        self._remote_cls = ray.remote(num_cpus=wcfg.num_cpus_per_worker, max_restarts=0)(_EpisodeActor)
        self.actors = [self._new_actor() for _ in range(wcfg.num_workers)]
        self.actor_restarts = 0

    def _new_actor(self) -> Any:
        return self._remote_cls.remote(self.cfg)

    def submit(self, inputs: Sequence[BatchInput]) -> PendingBatch:
        inputs = list(inputs)
        n = len(self.actors)
        size = max(1, min(self.cfg.episode.batch_size, -(-len(inputs) // n)))
        shards = [_Shard(i, chunk) for i, chunk in enumerate(_chunks(inputs, size))]
        pending = PendingBatch(inputs, shards)
        for shard in shards:
            self._dispatch(pending, shard, shard.index % n)
        return pending

    def _dispatch(self, pending: PendingBatch, shard: _Shard, slot: int) -> None:
        shard.attempts += 1
        actor = self.actors[slot]
        ref = actor.run.remote(shard.inputs)
        pending.inflight[ref] = (shard, slot, actor)

    def gather(self, pending: PendingBatch) -> list[EpisodeTrajectory]:
        import ray
        from ray.exceptions import RayActorError

        max_attempts = self.cfg.episode.worker.max_attempts
        while pending.inflight:
            ready, _ = ray.wait(list(pending.inflight), num_returns=1)
            ref = ready[0]
            shard, slot, actor = pending.inflight.pop(ref)
            try:
                result = ray.get(ref)
            except RayActorError as exc:
                if shard.attempts >= max_attempts:
                    raise WorkerLostError(
                        f"shard {shard.index} ({len(shard.inputs)} episodes, first "
                        f"{shard.inputs[0].episode_id!r}) lost its actor {shard.attempts} times"
                    ) from exc
                if self.actors[slot] is actor:  # the first failure seen from this actor replaces it
                    self._replace_actor(slot)
                logger.warning(
                    "actor %d died; re-running shard %d (attempt %d)", slot, shard.index, shard.attempts + 1
                )
                self._dispatch(pending, shard, slot)
                continue
            if shard.result is not None:  # cannot happen with one ref per attempt; guard against duplicates
                raise WorkerLostError(f"shard {shard.index} returned twice")
            shard.result = result
        out = [t for shard in pending.shards for t in (shard.result or [])]
        check_complete(pending.inputs, out)
        return out

    def _replace_actor(self, slot: int) -> None:
        import ray

        dead = self.actors[slot]
        self.actors[slot] = self._new_actor()
        self.actor_restarts += 1
        # Other shards queued on the dead actor fail with RayActorError too and are re-dispatched to this slot.
        ray.kill(dead, no_restart=True)

    def run_batch(self, inputs: Sequence[BatchInput]) -> list[EpisodeTrajectory]:
        return self.gather(self.submit(inputs))

    def metrics(self) -> dict[str, float]:
        import ray

        total: dict[str, float] = {}
        for m in ray.get([a.metrics.remote() for a in self.actors]):
            for k, v in m.items():
                total[k] = total.get(k, 0.0) + v
        total["episode/actor_restarts"] = float(self.actor_restarts)
        return total

    def close(self) -> None:
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []


def CustomRolloutWorker(cfg: Config, *, policy: Any = None) -> LocalRolloutWorker | RayRolloutWorker:
    """The worker ``episode.worker`` asks for: local (default) or Ray actors."""
    if cfg.episode.worker.use_ray:
        return RayRolloutWorker(cfg)
    return LocalRolloutWorker(cfg, policy=policy)
