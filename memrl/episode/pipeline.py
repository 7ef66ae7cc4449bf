"""``memrl run``: dataset → episodes → Parquet trajectories + ``metrics.json`` (resumable, with tqdm).

Reads like the algorithm: load episodes → draw each once through the :class:`~memrl.data.buffer.RolloutBuffer`
(as ``data.n_samples_per_prompt`` copies, the path training draws from) → skip those already committed → for each
chunk: run → write part (and the ``data.dump_dir`` dump) → update metrics. Every episode is written: the group
filter decides what trains, not what a run keeps.
"""

from __future__ import annotations

import logging
import resource
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from memrl.config import Config
from memrl.episode.output import TrajectoryWriter, check_job_identity, job_identity, write_json
from memrl.episode.worker import CustomRolloutWorker
from memrl.policy.models import describe_policy
from memrl.threads import follow_threads
from memrl.types import BatchInput, EpisodeTrajectory

logger = logging.getLogger(__name__)


def peak_rss_mb() -> float:
    """Peak resident memory of this process and of its reaped children (Linux reports KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 1024.0


def load_inputs(cfg: Config) -> list[BatchInput]:
    from memrl.data.adapters import load_dataset

    inputs, report = load_dataset(cfg.data)
    if report.skipped:
        logger.warning("dataset: %d records skipped (lenient mode): %s", report.skipped, report.reasons()[:3])
    return inputs


def draw_once(cfg: Config, inputs: Sequence[BatchInput]) -> tuple[Any, list[BatchInput]]:
    """Every input once, in dataset order, as ``data.n_samples_per_prompt`` copies drawn through the buffer."""
    from memrl.data.buffer import RolloutBuffer
    from memrl.data.datasource import RolloutDataSource

    if not inputs:
        return None, []
    source = RolloutDataSource(inputs, n_samples_per_prompt=cfg.data.n_samples_per_prompt, shuffle=False)
    buffer = RolloutBuffer(source, sampler=cfg.data.buffer_sampler, dump_dir=cfg.data.dump_dir)
    return buffer, [item for group in buffer.get_samples(len(inputs)) for item in group]


def summarise(entries: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Counts by status and mean reward over finished (non-failed) episodes."""
    status = Counter(e["status"] for e in entries)
    finished = [e["reward"] for e in entries if e["status"] != "failed"]
    return {
        "run/episodes": float(len(entries)),
        "run/inputs": float(len({e["source_episode_id"] for e in entries})),
        **{f"run/{s}": float(status.get(s, 0)) for s in ("completed", "truncated", "failed")},
        "run/mean_reward": (sum(finished) / len(finished)) if finished else 0.0,
    }


def run_episodes(
    cfg: Config,
    out_dir: str | Path | None = None,
    *,
    inputs: Sequence[BatchInput] | None = None,
    policy: Any = None,
    progress: bool = True,
    worker: Any = None,
) -> dict[str, Any]:
    """Run every input episode once (skipping committed ones) and return the metrics written to disk."""
    out = Path(out_dir or cfg.output_dir)
    writer = TrajectoryWriter(out)
    buffer, inputs = draw_once(cfg, list(inputs) if inputs is not None else load_inputs(cfg))
    done = writer.done_ids()
    check_job_identity(out, job_identity(cfg), has_results=bool(done))
    todo = [bi for bi in inputs if bi.episode_id not in done]
    logger.info("run: %d episodes, %d already done, %d to run → %s", len(inputs), len(done), len(todo), out)
    own_worker = worker is None
    worker = worker or CustomRolloutWorker(cfg, policy=policy)
    wcfg = cfg.episode.worker
    chunk = cfg.episode.batch_size * (wcfg.num_workers if wcfg.use_ray else 1)
    t0 = time.perf_counter()
    bar = tqdm(
        total=len(inputs),
        initial=len(inputs) - len(todo),
        disable=not progress,
        file=sys.stderr,
        desc="episodes",
        dynamic_ncols=True,
        mininterval=2.0,
    )
    try:
        for start in range(0, len(todo), chunk):
            follow_threads(f"episode batch {start // chunk + 1}")
            trajs: list[EpisodeTrajectory] = worker.run_batch(todo[start : start + chunk])
            buffer.dump_rollout(writer.next_part, trajs)
            writer.write(trajs)
            bar.update(min(chunk, len(todo) - start))
            bar.set_postfix(failed=sum(t.status.value == "failed" for t in trajs))
            metrics = _metrics(writer, worker, t0, len(todo[: start + chunk]))
            write_json(out / "metrics.json", {**metrics, "policy": describe_policy(cfg.policy)})
    finally:
        bar.close()
        if own_worker:
            worker.close()
    metrics = _metrics(writer, worker, t0, len(todo))
    metrics["policy"] = describe_policy(cfg.policy)
    write_json(out / "metrics.json", metrics)
    return metrics


def _metrics(writer: TrajectoryWriter, worker: Any, t0: float, ran: int) -> dict[str, Any]:
    wall = time.perf_counter() - t0
    metrics: dict[str, Any] = summarise(writer.manifests())
    metrics.update({k: float(v) for k, v in (worker.metrics() if worker else {}).items()})
    metrics.update(
        {
            "run/wall_time_s": wall,
            "run/episodes_this_session": float(ran),
            "run/episodes_per_s": ran / wall if wall > 0 else 0.0,
            "run/peak_rss_mb": peak_rss_mb(),
        }
    )
    return metrics
