"""Fixtures of the inspector tests: one real ``memrl run`` output (shared by the session) and a training log."""

from __future__ import annotations

import json
import math
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """2 synthetic episodes through the real pipeline (MiniLM + FAISS memory, tree rollout, sandboxed python tool
    with rollback, token_f1 reward, Parquet writer) with the scripted demo policy of memrl.inspect.demo."""
    from memrl.inspect.demo import make_demo_run

    return make_demo_run(tmp_path_factory.mktemp("inspect") / "run", num_episodes=2)


@pytest.fixture(scope="session")
def train_dir(tmp_path_factory):
    """A training output dir written by the trainer's own MetricsLogger (values are a made-up smooth curve:
    running `memrl train` takes minutes here; tests/inspect/test_notebooks.py has a slow test that does)."""
    from memrl.train.metrics import MetricsLogger

    out = tmp_path_factory.mktemp("train")
    log = MetricsLogger(out, tensorboard=False)
    log.log(0, {"eval/em": 0.1, "counters/em_start": 0.1})
    for step in range(1, 9):
        metrics = {
            "train/reward_mean": 0.2 + 0.05 * step,
            "rollout/reward_mean": 0.2 + 0.05 * step,
            "train/kl_ref": 0.001 * step,
            "train/approx_kl": 0.0005 * step,
            "train/entropy": 2.0 * math.exp(-0.1 * step),
            "counters/generated_tokens": 300.0 * step,
        }
        if step % 4 == 0:
            metrics["eval/em"] = 0.1 + 0.05 * step
        log.log(step, metrics)
    log.close()
    (out / "summary.json").write_text(json.dumps({"steps": 8, "em_start": 0.1, "em_final": 0.5}))
    return out
