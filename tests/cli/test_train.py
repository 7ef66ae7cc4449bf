"""``memrl train --fresh``: the same meaning as in ``memrl run`` / ``memrl eval`` (start over, discarding an earlier
run in the output dir); without it a run resumes."""

from __future__ import annotations

import json

from memrl.cli.main import main
from memrl.cli.train import TRAIN_OUTPUTS, clear_training

CONFIG = """
seed: 1
output_dir: {out}
data:
  adapter: synthetic
  options: {{num_episodes: 8, num_sessions: 2, turns_per_session: 2}}
  prompts_per_batch: 2
policy:
  model: {model}
tools:
  enabled: []
rollout:
  n: 2
  max_response_tokens: 4
episode:
  reward: lenient_match
  prompt_token_budget: 300
train:
  steps: 1
  eval_every: 0
  final_eval_episodes: 0
  checkpoint_every: 1
  tensorboard: false
  lora: {{r: 2, alpha: 4}}
"""


def _steps(out):
    return [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_fresh_starts_over_and_plain_train_resumes(tmp_path, tiny_model_dir, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = tmp_path / "run"
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG.format(out=out, model=tiny_model_dir))
    assert main(["train", "--config", str(cfg), "--no-progress"]) == 0
    first = _steps(out)
    assert first and (out / "checkpoints").is_dir()
    (out / "notes.txt").write_text("mine")

    # Resumed: the finished run does not train again, and train.steps=2 continues from step 1.
    assert main(["train", "--config", str(cfg), "--no-progress", "train.steps=2"]) == 0
    resumed = _steps(out)
    assert resumed[: len(first)] == first and max(resumed) == 2

    # --fresh: the earlier run is gone, this one starts at step 1; other files stay.
    assert main(["train", "--config", str(cfg), "--no-progress", "--fresh"]) == 0
    assert _steps(out) == first
    assert (out / "notes.txt").read_text() == "mine"
    assert "--fresh: removed" in capsys.readouterr().err


def test_clear_training_removes_only_what_training_writes(tmp_path):
    for name in TRAIN_OUTPUTS:
        target = tmp_path / name
        if "." in name:
            target.write_text("x")
        else:
            (target / "sub").mkdir(parents=True)
    (tmp_path / "trajectories").mkdir()
    (tmp_path / "eval.json").write_text("{}")
    assert sorted(clear_training(tmp_path)) == sorted(TRAIN_OUTPUTS)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json", "trajectories"]
    assert clear_training(tmp_path / "missing") == []


def test_fresh_knows_the_final_evaluation_directory():
    """``--fresh`` lists what training writes by name (the CLI does not import torch); the final evaluation's
    episodes directory, named in the training loop, must be among them."""
    from memrl.train.loop import FINAL_EVAL_DIR

    assert FINAL_EVAL_DIR in TRAIN_OUTPUTS
