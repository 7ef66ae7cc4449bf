"""Held-out evaluation during training: greedy, one chain per question, scored by the episode reward.

``eval/em`` is the mean episode reward over the held-out inputs with the configured reward function
(``exact_match`` by default, so it is exact-match accuracy); failed episodes count as 0. ``eval/em_ci_low`` /
``_high`` are a 95 % percentile bootstrap interval over episodes (2,000 resamples, fixed seed). The same inputs
and decoding are used at every evaluation and for every rollout strategy, so runs are comparable.

Besides the reward, each answer is scored by :data:`SIDE_METRICS` (``eval/lenient_match``: the gold answer anywhere
in the response, tag or not; ``eval/token_f1``), with the same intervals: an untrained model that never writes the
answer tag scores 0 strict, and the lenient score shows what it knew.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from memrl.episode.output import TrajectoryWriter
from memrl.formats import extract_answer
from memrl.rewards.base import RewardInput, make_reward
from memrl.rewards.benchmarks import LONGMEMEVAL_ABSTENTION, abstains
from memrl.rollout.metrics import episodes_tool_use, tool_use_metrics
from memrl.threads import follow_threads
from memrl.types import EpisodeStatus


def bootstrap_ci(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean (``(0, 0)`` for no values)."""
    if not values:
        return 0.0, 0.0
    x = np.asarray(values, dtype=np.float64)
    means = x[np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


# Scored besides the evaluation reward on every held-out answer (the end-of-run table's lenient and F1 columns).
SIDE_METRICS = ("lenient_match", "token_f1")


def _score(episode: Any) -> float:
    return episode.reward if episode.status is not EpisodeStatus.FAILED else 0.0


def side_scores(inputs: list, episodes: list) -> dict[str, float]:
    """``eval/<metric>`` and its bootstrap interval for each of :data:`SIDE_METRICS` over ``episodes`` (scored
    against their inputs' gold answers; a failed episode scores 0)."""
    gold = {bi.episode_id: bi for bi in inputs}
    answers = []
    for e in episodes:
        bi = gold[e.source_episode_id]
        text = e.steps[-1].meta.response_text if e.steps else ""
        answers.append(RewardInput.from_response(text, bi.target_answer, bi.final_query, bi.metadata))
    ok = [e.status is not EpisodeStatus.FAILED for e in episodes]
    out: dict[str, float] = {}
    for name in SIDE_METRICS:
        values = [v if good else 0.0 for v, good in zip(make_reward(name)(answers), ok, strict=True)]
        low, high = bootstrap_ci(values)
        out.update({
            f"eval/{name}": float(np.mean(values)) if values else 0.0,
            f"eval/{name}_ci_low": low,
            f"eval/{name}_ci_high": high,
        })  # fmt: skip
    return out


def evaluate_held_out(
    res: Any,
    inputs: list | None = None,
    desc: str | None = None,
    leave: bool = True,
    save_dir: Path | None = None,
) -> dict[str, float]:
    """Evaluate on ``inputs`` (default: the in-run subset ``res.eval_inputs``). ``desc``: show a progress bar
    over the episodes on stderr with this label (the start and final evaluations take minutes); ``leave``: keep
    the finished bar on screen. ``save_dir``: also write the episodes there as ``memrl run`` does (replacing what
    it held), for ``memrl inspect``."""
    t0 = time.perf_counter()
    res.model.eval()
    inputs = res.eval_inputs if inputs is None else inputs
    episodes: list = []
    size = max(1, res.cfg.episode.batch_size)
    bar = tqdm(
        total=len(inputs),
        desc=desc,
        unit="episode",
        file=sys.stderr,
        disable=not desc,
        leave=leave,
        dynamic_ncols=True,
        mininterval=2.0,
    )
    with bar:
        for i in range(0, len(inputs), size):
            follow_threads(f"evaluation batch {i // size + 1}")
            episodes.extend(res.eval_runner.run_batch(inputs[i : i + size]))
            bar.set_postfix(em=f"{np.mean([_score(e) for e in episodes]):.3f}", refresh=False)
            bar.update(len(inputs[i : i + size]))
    if save_dir is not None:
        shutil.rmtree(save_dir, ignore_errors=True)
        TrajectoryWriter(save_dir).write(episodes)
    rewards = [_score(e) for e in episodes]
    low, high = bootstrap_ci(rewards)
    return {
        "eval/em": float(np.mean(rewards)) if rewards else 0.0,
        "eval/em_ci_low": low,
        "eval/em_ci_high": high,
        "eval/episodes": float(len(episodes)),
        "eval/failed": float(sum(e.status is EpisodeStatus.FAILED for e in episodes)),
        **side_scores(inputs, episodes),
        **breakdown(inputs, episodes),
        **(tool_use_metrics(episodes_tool_use(episodes), "eval/tooluse/") if res.cfg.tools.enabled else {}),
        "eval/time_s": time.perf_counter() - t0,
    }


def breakdown(inputs: list, episodes: list) -> dict[str, float]:
    """``eval/em/<group>`` per question type or LoCoMo category, and ``eval/em/answerable`` /
    ``eval/em/unanswerable`` (adversarial, abstention) with the interval of the answerable mean (LoCoMo's F1 over
    categories 1–4, the number papers report); only the splits that have more than one part. With both parts,
    also ``eval/abstains/answerable``: the share of answerable questions the answer declines (in any phrase the
    benchmarks' scorers accept), since a policy taught to abstain can keep its F1 only if it abstains there
    rarely."""
    from memrl.episode.evaluate import group_key, unanswerable

    meta = {bi.episode_id: bi.metadata for bi in inputs}
    by_group: dict[str, list[float]] = {}
    by_answer: dict[str, list[float]] = {}
    declined: list[float] = []
    for e in episodes:
        md = meta.get(e.source_episode_id, {})
        by_group.setdefault(group_key(md), []).append(_score(e))
        by_answer.setdefault("unanswerable" if unanswerable(md) else "answerable", []).append(_score(e))
        if not unanswerable(md):
            declined.append(float(_declines(e)))
    out: dict[str, float] = {}
    for parts in (by_group, by_answer):
        if len(parts) > 1:
            out.update({f"eval/em/{name}": float(np.mean(v)) for name, v in sorted(parts.items())})
    if len(by_answer) > 1:
        low, high = bootstrap_ci(by_answer["answerable"])
        out.update({"eval/em/answerable_ci_low": low, "eval/em/answerable_ci_high": high})
        out["eval/abstains/answerable"] = float(np.mean(declined))
    return out


def _declines(episode: Any) -> bool:
    text = episode.steps[-1].meta.response_text if episode.steps else ""
    return abstains(extract_answer(text), LONGMEMEVAL_ABSTENTION)
