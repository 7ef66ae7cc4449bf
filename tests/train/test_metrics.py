from __future__ import annotations

import json

from memrl.train.metrics import MetricsLogger, plot_curves, read_metrics


def test_resume_drops_steps_after_the_checkpoint_and_torn_lines(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=False)
    for step in range(1, 5):
        log.log(step, {"train/reward_mean": step / 10, "counters/generated_tokens": step * 100.0})
    log.close()
    with open(tmp_path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 5, "train/rew')  # killed mid-write
    log = MetricsLogger(tmp_path, resume_step=2, tensorboard=False)
    log.log(3, {"train/reward_mean": 0.9, "eval/em": 0.5})
    log.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["train/reward_mean"] == 0.9
    assert all(json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines())
    png = plot_curves(tmp_path / "metrics.jsonl", tmp_path / "curve.png")
    assert png.is_file() and png.stat().st_size > 1000


def test_non_finite_values_are_not_logged(tmp_path):
    log = MetricsLogger(tmp_path, tensorboard=True)
    log.log(1, {"a": float("nan"), "b": 1.0})
    log.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "b": 1.0}]
    assert (tmp_path / "tb").is_dir()
