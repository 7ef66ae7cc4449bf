"""``memrl train``: the LoRA GRPO loop. It reads like the algorithm::

    for step in steps:
        groups   = buffer.rollout(runner.run_batch, prompts_per_batch)  # draw → run episodes → filter → refill
        batch    = builder.build(groups)                           # trajectories → PackedBatch
        metrics  = updater.update(batch, replay.sample(...))       # GRPO (+ SFT/RFT replay) on the LoRA adapter
        publish(policy)                                            # hot-swap the adapter into the backend
        evaluate every k steps; checkpoint every c steps

Debugging (as slime's): ``data.dump_dir`` writes each step's rollout; ``train.rollout_only`` generates and dumps
without updating; ``train.train_only=<dump dir>`` trains from the dumps without generating, and the same dumps
give the same updates (no evaluation runs in either mode).

Resume: the newest complete checkpoint restores adapter, optimizer, RNG, buffer and data-source position, replay
buffer and counters; every step re-seeds its randomness from ``(seed, step)``, so a run killed at any point and
resumed reproduces the uninterrupted run's metrics, with no episode lost or repeated.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from memrl.config import Config
from memrl.data.buffer import (
    DrawnGroups,
    group_episodes,
    has_reward_signal,
    read_rollout_dump,
    select_groups,
)
from memrl.data.datasource import write_json_atomic
from memrl.paths import cache_dir
from memrl.policy.models import describe_policy
from memrl.rollout.metrics import episodes_tool_use, tool_use_metrics
from memrl.templates import templates_digest
from memrl.threads import follow_threads
from memrl.train.checkpoint import (
    TrainState,
    clean_stale,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from memrl.train.config import TrainConfig
from memrl.train.evaluate import SIDE_METRICS, evaluate_held_out
from memrl.train.metrics import MetricsLogger, plot_curves
from memrl.train.replay import ReplayBuffer, ReplaySample
from memrl.train.roles import active_roles, keep_roles, memory_rollout_metrics
from memrl.train.setup import TrainResources, build_resources, publish_adapter
from memrl.types import BatchInput, EpisodeStatus, EpisodeTrajectory

logger = logging.getLogger(__name__)


TRAIN_STREAM, EVAL_STREAM = 0, 1
DECODED = "rollout/decode_tokens"  # the runner's cumulative count of tokens the policy decoded
FINAL_EVAL_DIR = "eval_final"  # the final evaluation's episodes, in memrl run's format (memrl inspect)
PHASE_TIMES = {
    "episode/time_ingest_s": "time/memory_rollout_s",
    "episode/time_generate_s": "time/answer_rollout_s",
}


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


def _draw(res: TrainResources, step: int) -> DrawnGroups:
    """This step's rollout: live through the buffer, or replayed from ``train.train_only``'s dump."""
    cfg = res.cfg
    if cfg.train.train_only is None:
        return res.buffer.rollout(
            res.runner.run_batch,
            cfg.data.prompts_per_batch,
            rollout_id=step,
            max_rounds=cfg.data.max_sampling_rounds,
        )
    path = Path(cfg.train.train_only) / f"rollout_{step:06d}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"train.train_only: no dump for step {step} ({path}); dumped steps end earlier"
        )
    episodes = read_rollout_dump(path)
    chosen = select_groups(res.buffer.group_filter, episodes, cfg.data.prompts_per_batch)
    return DrawnGroups(chosen.kept, episodes, dropped=chosen.dropped)


def run_step(res: TrainResources, step: int, counters: dict[str, float]) -> StepResult:
    """One iteration: draw groups (rollout, filter, refill) → build batch → update → publish weights."""
    before = RunnerMark.take(res)
    rollout = _draw(res, step)
    metrics = step_metrics(res, rollout, before)
    replay = _replay_sample(res, step)
    if trainable := _trainable(res, step, rollout):
        t0 = time.perf_counter()
        batch = res.builder.build(trainable)
        metrics.update(res.updater.update(batch, replay=replay))
        metrics["time/update_s"] = time.perf_counter() - t0
        publish_adapter(res, step)
    if res.replay is not None:
        res.replay.add(rollout.usable)
    counters["generated_tokens"] = counters.get("generated_tokens", 0.0) + metrics["rollout/generated_tokens"]
    counters["episodes"] = counters.get("episodes", 0.0) + len(rollout.episodes)
    return StepResult(metrics, rollout.episodes)


@dataclass(frozen=True)
class RunnerMark:
    """The runner's cumulative counters and the clock before a rollout: a step's metrics are the differences."""

    t0: float
    decoded: float
    phases: dict[str, float]

    @classmethod
    def take(cls, res: TrainResources) -> RunnerMark:
        t0 = time.perf_counter()
        m = res.runner.metrics
        return cls(t0, m.get(DECODED, 0.0), {k: m.get(k, 0.0) for k in PHASE_TIMES})


def step_metrics(res: TrainResources, rollout: DrawnGroups, before: RunnerMark) -> dict[str, float]:
    """The rollout's ``rollout/*``, ``time/*`` (rollout and its phases), memory and tool-use metrics."""
    t_rollout = time.perf_counter() - before.t0
    episodes, runner = rollout.episodes, res.runner.metrics
    trainable = [ep for group in rollout.groups for ep in group]
    masked = sum(sum(s.response_mask) for e in episodes for s in e.steps)
    # The budget counts tokens the model decoded: a tree decodes a shared prefix once for all its leaves.
    generated = runner.get(DECODED, before.decoded + masked) - before.decoded
    groups = group_episodes(rollout.usable)
    return {
        "rollout/episodes": float(len(episodes)),
        "rollout/failed": float(sum(e.status is EpisodeStatus.FAILED for e in episodes)),
        "rollout/reward_mean": float(np.mean([e.reward for e in episodes])) if episodes else 0.0,
        "rollout/generated_tokens": float(generated),
        "rollout/trained_tokens": float(sum(sum(s.response_mask) for e in trainable for s in e.steps)),
        "rollout/mixed_groups": sum(map(has_reward_signal, groups)) / max(1, len(groups)),
        "rollout/groups_trained": float(len(rollout.groups)),
        "rollout/sampling_rounds": float(rollout.rounds),
        "time/rollout_s": t_rollout,
        # The step profile: memory writes (ingest, snapshot scoring included) and answer generation.
        **{name: runner.get(k, 0.0) - before.phases[k] for k, name in PHASE_TIMES.items()},
        **memory_rollout_metrics(episodes),
        # How answers used the tools: calls per answer, failed calls, rollbacks, gold calls, copied results.
        **(tool_use_metrics(episodes_tool_use(episodes)) if res.cfg.tools.enabled else {}),
    }


def _replay_sample(res: TrainResources, step: int) -> ReplaySample | None:
    """This step's replay rows (``train.replay``), drawn every step the buffer holds some, trained or not."""
    cfg = res.cfg
    if res.replay is None or cfg.train.replay.batch_size <= 0 or not len(res.replay):
        return None
    sample = res.replay.sample(cfg.train.replay.batch_size)
    return dataclasses.replace(sample, roles=tuple(active_roles(cfg.train, step)))


def _trainable(res: TrainResources, step: int, rollout: DrawnGroups) -> list[EpisodeTrajectory]:
    """The kept groups' episodes, cut to the roles ``step`` trains; none under ``train.rollout_only``."""
    cfg = res.cfg
    if cfg.train.rollout_only:
        return []
    kept = [ep for group in rollout.groups for ep in group]
    if trainable := keep_roles(kept, active_roles(cfg.train, step)):
        return trainable
    if rollout.usable:
        logger.info("step %d: no group passed data.group_filter=%s; no update", step, cfg.data.group_filter)
    else:
        logger.warning("step %d: no usable episode (all %d failed); no update", step, len(rollout.episodes))
    return []


def _budget_left(tc: TrainConfig, counters: dict[str, float]) -> bool:
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
    res.buffer.load_state_dict(state.data_source)
    if res.replay is not None and state.replay is not None:
        res.replay.load_state_dict(state.replay)
    publish_adapter(res, state.step)
    return state


def _checkpoint(res: TrainResources, ckpt_root: Path, step: int, counters: dict[str, float]) -> None:
    replay = res.replay.state_dict() if res.replay is not None else None
    state = TrainState(step=step, data_source=res.buffer.state_dict(), counters=dict(counters), replay=replay)
    save_checkpoint(ckpt_root, res.model, res.updater.optimizer, state, keep=res.cfg.train.keep_checkpoints)


def _eval(
    res: TrainResources,
    step: int,
    inputs: list | None = None,
    desc: str | None = None,
    leave: bool = True,
    save_dir: Path | None = None,
) -> dict[str, float]:
    # Evaluation gets its own fixed seed, so it never shifts the training stream.
    seed_everything(step_seed(res.cfg.seed, step, EVAL_STREAM), res)
    return evaluate_held_out(res, inputs, desc=desc, leave=leave, save_dir=save_dir)


def _start_eval(res: TrainResources, progress: bool = False) -> dict[str, float]:
    """The untrained model's evaluation on the final-evaluation episodes, computed once per (model, config,
    episodes) and reused from ``$MEMRL_CACHE_DIR/evals/`` by later runs and other seeds of the same setup."""
    key = start_eval_key(res)
    path = cache_dir() / "evals" / f"{key}.json"
    if path.is_file():
        logger.info("start evaluation reused from %s", path)
        return json.loads(path.read_text(encoding="utf-8"))
    start = _eval(res, 0, res.final_eval_inputs, desc="start eval" if progress else None)
    write_json_atomic(path, start)
    return start


def start_eval_key(res: TrainResources) -> str:
    """What the untrained evaluation depends on: the model, the evaluation-time config and the episodes' content
    (not only their ids: a dataset option that rewords a question keeps its id). Not the seed: the evaluation is
    greedy (``eval_config``), so every seed of one setup shares it."""
    cfg = res.cfg
    from memrl.train.setup import eval_config

    ecfg = eval_config(cfg)
    payload = {
        "policy": dataclasses.asdict(cfg.policy),
        "model": describe_policy(cfg.policy),
        "memory": dataclasses.asdict(cfg.memory),
        "tools": dataclasses.asdict(cfg.tools),
        "episode": dataclasses.asdict(ecfg.episode),
        # the prompts' text, not only their names
        "templates": templates_digest(ecfg.episode.prompt_template),
        "rollout": dataclasses.asdict(ecfg.rollout),
        "inputs": episodes_digest(res.final_eval_inputs),
        "side_metrics": SIDE_METRICS,  # an entry cached before a metric was added lacks its score
    }
    blob = json.dumps(payload, sort_keys=True, default=str).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()[:20]


def episodes_digest(inputs: list[BatchInput]) -> str:
    h = hashlib.sha256()
    for bi in inputs:  # a frozen dataclass's repr spells every field, and is cheaper than asdict + json
        h.update(repr(bi).encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _counters_from_eval(counters: dict[str, float], name: str, result: dict[str, float]) -> None:
    """``name`` is ``em_start`` or ``em_final``: the reward's score and interval, and those of the side metrics
    (``lenient_match_start``, ``token_f1_final``, ...) where the evaluation scored them."""
    counters["eval_episodes"] = result["eval/episodes"]
    when = name.removeprefix("em_")
    for metric, key in (("em", name), *((m, f"{m}_{when}") for m in SIDE_METRICS)):
        if f"eval/{metric}" in result:
            counters[key] = result[f"eval/{metric}"]
            counters[f"{key}_ci_low"] = result[f"eval/{metric}_ci_low"]
            counters[f"{key}_ci_high"] = result[f"eval/{metric}_ci_high"]


def train(cfg: Config, *, resources: TrainResources | None = None, progress: bool = False) -> dict[str, Any]:
    """Run (or resume) training for the root config ``cfg``; returns the summary written to ``summary.json``.

    ``progress``: progress bars on stderr for the evaluations and the steps (log lines print above them)."""
    with logging_redirect_tqdm() if progress else nullcontext():
        return _train(cfg, resources, progress)


def _train(cfg: Config, resources: TrainResources | None, progress: bool) -> dict[str, Any]:
    run_dir = Path(cfg.output_dir)
    ckpt_root = run_dir / "checkpoints"
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.train.rollout_only and not cfg.data.dump_dir:
        raise ValueError("train.rollout_only generates rollouts only to dump them: set data.dump_dir too")
    res = resources or build_resources(cfg)
    state = _restore(res, ckpt_root)
    counters = dict(state.counters)
    evaluating = not cfg.train.rollout_only and cfg.train.train_only is None
    # train.final_eval_episodes=0: no start or final evaluation
    ends = evaluating and bool(res.final_eval_inputs)
    log = MetricsLogger(run_dir, resume_step=state.step, tensorboard=cfg.train.tensorboard)
    try:
        if ends and "em_start" not in counters:
            t0 = time.perf_counter()
            start = _start_eval(res, progress)
            _counters_from_eval(counters, "em_start", start)
            counters["eval_wall_s"] = counters.get("eval_wall_s", 0.0) + time.perf_counter() - t0
            log.log(0, {**start, **{f"counters/{k}": v for k, v in counters.items()}})
        if cfg.train.warm_start.episodes and "warm_start_s" not in counters and not cfg.train.train_only:
            follow_threads("the warm start")
            _warm_start(res, counters, log, ckpt_root, progress)
        if cfg.train.kl_reference == "warm_start":  # read back from disk: a resumed run anchors the same way
            res.updater.anchor_reference(_warm_start_adapter(cfg))
        elif cfg.train.kl_reference == "start":
            res.updater.anchor_reference(cfg.policy.lora_path)
        step = _train_steps(res, state.step, counters, log, ckpt_root, evaluating, progress)
        if ends and (step != state.step or "em_final" not in counters):  # not again on a finished run
            follow_threads("the final evaluation")
            t0 = time.perf_counter()
            desc = "final eval" if progress else None
            final = _eval(res, step, res.final_eval_inputs, desc=desc, save_dir=run_dir / FINAL_EVAL_DIR)
            _counters_from_eval(counters, "em_final", final)
            counters["eval_wall_s"] = counters.get("eval_wall_s", 0.0) + time.perf_counter() - t0
            log.log(step, {**final, **{f"counters/{k}": v for k, v in counters.items()}})
        _checkpoint(res, ckpt_root, step, counters)
    finally:
        log.close()
    return _finish(cfg, run_dir, step, counters)


def _warm_start(
    res: TrainResources, counters: dict[str, float], log: MetricsLogger, ckpt_root: Path, progress: bool
) -> None:
    """Imitation warm start of the memory writer or the answer role (``train.warm_start``), logged and
    checkpointed as step 0. Its time counts in the training budget (``wall_s``), so arms with and without it get
    the same budget. The adapter it ends with is also kept in ``<output_dir>/warm_start/adapter`` (checkpoint
    pruning removes step 0): the imitation-only policy, to compare with the one RL makes of it (``memrl bench
    extract`` for a writer, ``memrl eval`` for answers)."""
    from memrl.train.lora import save_adapter
    from memrl.train.warm_start import warm_start
    from memrl.train.warm_start_answer import answer_warm_start

    run = answer_warm_start if res.cfg.train.warm_start.role == "answer" else warm_start
    metrics = run(res, progress)
    save_adapter(res.model, _warm_start_adapter(res.cfg))
    publish_adapter(res, 0)
    counters["warm_start_s"] = metrics["time/warm_start_s"]
    counters["wall_s"] = counters.get("wall_s", 0.0) + metrics["time/warm_start_s"]
    log.log(0, {**metrics, **{f"counters/{k}": v for k, v in counters.items()}})
    _checkpoint(res, ckpt_root, 0, counters)


def _warm_start_adapter(cfg: Config) -> Path:
    return Path(cfg.output_dir) / "warm_start" / "adapter"


def _train_steps(
    res: TrainResources,
    done: int,
    counters: dict[str, float],
    log: MetricsLogger,
    ckpt_root: Path,
    evaluating: bool,
    progress: bool = False,
) -> int:
    """Steps ``done + 1 ..`` until ``train.steps`` or a budget ends; returns the last step run.

    ``wall_s`` counts training: steps, in-run evaluations (on the ``eval_episodes`` subset), logging and
    checkpoints; the start and final evaluations are counted apart (``eval_wall_s``)."""
    cfg = res.cfg
    step = done
    tick = time.perf_counter()
    # Steps take seconds to minutes each: the bar shows how many are left and the last rewards.
    bar = tqdm(
        total=cfg.train.steps,
        initial=done,
        desc="train",
        unit="step",
        file=sys.stderr,
        disable=not progress,
        dynamic_ncols=True,
    )
    with bar:
        for step in range(done + 1, cfg.train.steps + 1):
            if not _budget_left(cfg.train, counters):
                step -= 1
                break
            follow_threads(f"training step {step}")
            seed_everything(step_seed(cfg.seed, step), res)
            metrics = run_step(res, step, counters).metrics
            if evaluating and cfg.train.eval_every and step % cfg.train.eval_every == 0:
                metrics.update(_eval(res, step, desc="eval" if progress else None, leave=False))
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
            bar.set_postfix(reward=f"{metrics['rollout/reward_mean']:.3f}", refresh=False)
            bar.update(1)
    return step


def _finish(cfg: Config, run_dir: Path, step: int, counters: dict[str, float]) -> dict[str, Any]:
    png = plot_curves(run_dir / "metrics.jsonl", run_dir / "curve.png", title=Path(cfg.output_dir).name)
    ci = lambda name: (  # noqa: E731
        [counters[f"{name}_ci_low"], counters[f"{name}_ci_high"]] if f"{name}_ci_low" in counters else None
    )
    adapter = run_dir / "checkpoints" / f"step_{step:06d}" / "adapter"
    summary = {
        "em_start": counters.get("em_start"),
        "em_start_ci": ci("em_start"),
        "em_final": counters.get("em_final"),
        "em_final_ci": ci("em_final"),
        **{f"{m}_{w}": counters.get(f"{m}_{w}") for m in SIDE_METRICS for w in ("start", "final")},
        **{f"{m}_{w}_ci": ci(f"{m}_{w}") for m in SIDE_METRICS for w in ("start", "final")},
        "eval_reward": cfg.train.eval_reward or cfg.episode.reward,
        "eval_split": cfg.train.final_eval_split or cfg.train.eval_split,
        "memory": cfg.episode.context,
        "run_dir": str(run_dir),
        "eval_dir": str(run_dir / FINAL_EVAL_DIR) if (run_dir / FINAL_EVAL_DIR).is_dir() else None,
        "adapter": str(adapter) if adapter.is_dir() else None,
        "eval_episodes": int(counters.get("eval_episodes", 0)) or None,
        "eval_wall_s": round(counters.get("eval_wall_s", 0.0), 1),
        "seed": cfg.seed,
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
