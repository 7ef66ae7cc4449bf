"""``memrl train``: the LoRA GRPO loop. It reads like the algorithm::

    for step in steps:
        groups   = data_source.get_samples(prompts_per_batch)      # sample prompts
        episodes = runner.run_batch(groups)                        # run episodes (memory → rollout → reward)
        batch    = builder.build(episodes)                         # trajectories → PackedBatch
        metrics  = updater.update(batch, replay.sample(...))       # GRPO (+ SFT/RFT replay) on the LoRA adapter
        publish(policy)                                            # hot-swap the adapter into the backend
        evaluate every k steps; checkpoint every c steps

Resume: the newest complete checkpoint restores adapter, optimizer, RNG, data-source position, replay buffer
and counters; every step re-seeds its randomness from ``(seed, step)``, so a run killed at any point and
resumed reproduces the uninterrupted run's metrics, with no episode lost or repeated.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memrl.train.checkpoint import (
    TrainState,
    clean_stale,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from memrl.train.evaluate import evaluate
from memrl.train.metrics import MetricsLogger, plot_curves
from memrl.train.replay import ReplayBuffer
from memrl.train.setup import TrainResources, build_resources, publish_adapter
from memrl.types import EpisodeStatus, EpisodeTrajectory

logger = logging.getLogger(__name__)


TRAIN_STREAM, EVAL_STREAM = 0, 1
DECODED = "rollout/decode_tokens"  # the runner's cumulative count of tokens the policy decoded


def step_seed(seed: int, step: int, stream: int = TRAIN_STREAM) -> int:
    """A per-step seed: the same ``(seed, step)`` always draws the same samples, whatever ran before."""
    return int(np.random.SeedSequence([seed, step, stream]).generate_state(1)[0])


def seed_everything(seed: int, res: TrainResources | None = None) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if res is not None:
        res.reseed(seed)


@dataclass
class StepResult:
    metrics: dict[str, float]
    episodes: list[EpisodeTrajectory]


def run_step(res: TrainResources, step: int, counters: dict[str, float]) -> StepResult:
    """One iteration: sample → run episodes → build batch → update → publish weights."""
    cfg = res.cfg
    t0 = time.perf_counter()
    groups = res.data_source.get_samples(cfg.data.prompts_per_batch)
    inputs = [inp for group in groups for inp in group]
    decoded_before = res.runner.metrics.get(DECODED, 0.0)
    episodes = res.runner.run_batch(inputs)
    t_rollout = time.perf_counter() - t0
    usable = [e for e in episodes if e.status in (EpisodeStatus.COMPLETED, EpisodeStatus.TRUNCATED)]
    trained = sum(sum(s.response_mask) for e in episodes for s in e.steps)
    # The budget counts tokens the model decoded: a tree decodes a shared prefix once for all its leaves.
    generated = res.runner.metrics.get(DECODED, decoded_before + trained) - decoded_before
    metrics: dict[str, float] = {
        "rollout/episodes": float(len(episodes)),
        "rollout/failed": float(len(episodes) - len(usable)),
        "rollout/reward_mean": float(np.mean([e.reward for e in episodes])) if episodes else 0.0,
        "rollout/generated_tokens": float(generated),
        "rollout/trained_tokens": float(trained),
        "time/rollout_s": t_rollout,
    }
    replay_sample = None
    if res.replay is not None and cfg.train.replay.batch_size > 0 and len(res.replay):
        replay_sample = res.replay.sample(cfg.train.replay.batch_size)
    trainable, metrics["rollout/mixed_groups"] = mixed_groups(usable)
    if not cfg.train.filter_groups:
        trainable = usable
    metrics["rollout/filtered_episodes"] = float(len(usable) - len(trainable))
    if trainable:
        t1 = time.perf_counter()
        batch = res.builder.build(trainable)
        metrics.update(res.updater.update(batch, replay=replay_sample))
        metrics["time/update_s"] = time.perf_counter() - t1
        publish_adapter(res, step)
    elif usable:
        logger.info("step %d: every group's rewards are equal (no GRPO signal); no update", step)
    else:
        logger.warning("step %d: no usable episode (all %d failed); no update", step, len(episodes))
    if res.replay is not None:
        res.replay.add(usable)
    counters["generated_tokens"] = counters.get("generated_tokens", 0.0) + generated
    counters["episodes"] = counters.get("episodes", 0.0) + len(episodes)
    return StepResult(metrics, episodes)


def mixed_groups(episodes: list[EpisodeTrajectory]) -> tuple[list[EpisodeTrajectory], float]:
    """The episodes of groups whose rewards differ (the only ones with a nonzero GRPO advantage), in input
    order, and the share of groups that are mixed."""
    rewards: dict[str, set[float]] = {}
    for e in episodes:
        rewards.setdefault(e.group_id, set()).add(float(e.reward))
    mixed = {g for g, r in rewards.items() if len(r) > 1}
    return [e for e in episodes if e.group_id in mixed], len(mixed) / max(1, len(rewards))


def _budget_left(cfg: Any, counters: dict[str, float]) -> bool:
    tc = cfg.train
    if tc.max_wall_s is not None and counters.get("wall_s", 0.0) >= tc.max_wall_s:
        logger.info("wall-clock budget %.0f s reached", tc.max_wall_s)
        return False
    if (
        tc.max_generated_tokens is not None
        and counters.get("generated_tokens", 0.0) >= tc.max_generated_tokens
    ):
        logger.info("generated-token budget %d reached", tc.max_generated_tokens)
        return False
    return True


def _restore(res: TrainResources, ckpt_root: Path) -> TrainState:
    stale = clean_stale(ckpt_root)
    if stale:
        logger.info("removed %d incomplete checkpoint(s) left by a killed run", stale)
    last = latest_checkpoint(ckpt_root)
    if last is None:
        return TrainState()
    state = load_checkpoint(last, res.model, res.updater.optimizer)
    res.data_source.load_state_dict(state.data_source)
    if res.replay is not None and "replay" in state.extra:
        res.replay.load_state_dict(state.extra["replay"])
    publish_adapter(res, state.step)
    return state


def _checkpoint(res: TrainResources, ckpt_root: Path, step: int, counters: dict[str, float]) -> None:
    extra = {"replay": res.replay.state_dict()} if res.replay is not None else {}
    state = TrainState(
        step=step, data_source=res.data_source.state_dict(), counters=dict(counters), extra=extra
    )
    save_checkpoint(ckpt_root, res.model, res.updater.optimizer, state, keep=res.cfg.train.keep_checkpoints)


def _eval(res: TrainResources, step: int) -> dict[str, float]:
    # Evaluation gets its own fixed seed, so it never shifts the training stream.
    seed_everything(step_seed(res.cfg.seed, step, EVAL_STREAM), res)
    return evaluate(res)


def train(cfg: Any, *, resources: TrainResources | None = None) -> dict[str, Any]:
    """Run (or resume) training for the root config ``cfg``; returns the summary written to ``summary.json``."""
    run_dir = Path(cfg.output_dir)
    ckpt_root = run_dir / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    res = resources or build_resources(cfg)
    state = _restore(res, ckpt_root)
    counters = dict(state.counters)
    log = MetricsLogger(run_dir, resume_step=state.step, tensorboard=cfg.train.tensorboard)
    try:
        if "em_start" not in counters:
            t0 = time.perf_counter()
            start = _eval(res, 0)
            counters["em_start"] = start["eval/em"]
            counters["wall_s"] = counters.get("wall_s", 0.0) + time.perf_counter() - t0
            log.log(0, {**start, **{f"counters/{k}": v for k, v in counters.items()}})
        step, last_eval = state.step, state.step
        # Wall time counts everything from here: steps, evals, logging and checkpoints (the time between two
        # counter updates goes to the later one).
        tick = time.perf_counter()
        for step in range(state.step + 1, cfg.train.steps + 1):
            if not _budget_left(cfg, counters):
                step -= 1
                break
            seed_everything(step_seed(cfg.seed, step), res)
            result = run_step(res, step, counters)
            metrics = result.metrics
            if cfg.train.eval_every and step % cfg.train.eval_every == 0:
                metrics.update(_eval(res, step))
                counters["em_final"], last_eval = metrics["eval/em"], step
            now = time.perf_counter()
            counters["wall_s"] = counters.get("wall_s", 0.0) + now - tick
            tick = now
            metrics.update({f"counters/{k}": v for k, v in counters.items()})
            log.log(step, metrics)
            logger.info(
                "step %d: reward %.3f, eval %s, tokens %d",
                step,
                metrics["rollout/reward_mean"],
                metrics.get("eval/em", "-"),
                counters["generated_tokens"],
            )
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0:
                _checkpoint(res, ckpt_root, step, counters)
        if last_eval != step or "em_final" not in counters:
            final = _eval(res, step)
            counters["em_final"] = final["eval/em"]
            counters["wall_s"] = counters.get("wall_s", 0.0) + time.perf_counter() - tick
            log.log(step, {**final, **{f"counters/{k}": v for k, v in counters.items()}})
        _checkpoint(res, ckpt_root, step, counters)
    finally:
        log.close()
    return _finish(cfg, run_dir, step, counters)


def _finish(cfg: Any, run_dir: Path, step: int, counters: dict[str, float]) -> dict[str, Any]:
    png = plot_curves(run_dir / "metrics.jsonl", run_dir / "curve.png", title=Path(cfg.output_dir).name)
    summary = {
        "em_start": counters.get("em_start"),
        "em_final": counters.get("em_final"),
        "generated_tokens": int(counters.get("generated_tokens", 0)),
        "wall_s": round(counters.get("wall_s", 0.0), 1),
        "steps": step,
        "episodes": int(counters.get("episodes", 0)),
        "strategy": cfg.rollout.strategy,
        "curve_png": str(png) if png else None,
        "config": dataclasses.asdict(cfg.train),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary


__all__ = ["ReplayBuffer", "run_step", "step_seed", "train"]
