"""Held-out evaluation during training: greedy, one chain per question, scored by the episode reward.

``eval/em`` is the mean episode reward over the held-out inputs with the configured reward function
(``exact_match`` by default, so it is exact-match accuracy); failed episodes count as 0. The same inputs and
decoding are used at every evaluation and for every rollout strategy, so runs are comparable.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from memrl.types import EpisodeStatus


def evaluate(res: Any) -> dict[str, float]:
    t0 = time.perf_counter()
    res.model.eval()
    episodes = []
    size = max(1, res.cfg.episode.batch_size)
    for i in range(0, len(res.eval_inputs), size):
        episodes.extend(res.eval_runner.run_batch(res.eval_inputs[i : i + size]))
    rewards = [e.reward if e.status is not EpisodeStatus.FAILED else 0.0 for e in episodes]
    return {
        "eval/em": float(np.mean(rewards)) if rewards else 0.0,
        "eval/episodes": float(len(episodes)),
        "eval/failed": float(sum(e.status is EpisodeStatus.FAILED for e in episodes)),
        "eval/time_s": time.perf_counter() - t0,
    }
