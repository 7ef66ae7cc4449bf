"""End to end: `memrl train` on a random-init tiny model; SIGKILL mid-run, resume, compare with an uninterrupted run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
STEPS = 6  # the kill lands after step 2: several steps must remain however fast a step is
# Metrics that depend on the clock are not expected to match.
CLOCK = ("time/", "eval/time_s", "counters/wall_s", "counters/eval_wall_s")

CONFIG = """
seed: 3
output_dir: {out}
data:
  adapter: synthetic
  options: {{num_episodes: 12, num_sessions: 2, turns_per_session: 2}}
  n_samples_per_prompt: 1
  prompts_per_batch: 2
policy:
  model: {model}
tools:
  enabled: []
rollout:
  strategy: chain
  n: 3
  max_response_tokens: 8
episode:
  reward: train_fixtures:vowel_reward
  prompt_token_budget: 400
train:
  steps: {steps}
  lr: 0.01
  eval_every: 2
  eval_episodes: 2
  checkpoint_every: 1
  tensorboard: false
  lora: {{r: 4, alpha: 8}}
"""


def _cmd(cfg: Path) -> list[str]:
    return [sys.executable, "-m", "memrl.cli.main", "train", "--config", str(cfg)]


def _env() -> dict[str, str]:
    env = dict(
        os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    return env


def _write_cfg(tmp: Path, name: str, model: Path) -> tuple[Path, Path]:
    out = tmp / name
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(CONFIG.format(out=out, model=model, steps=STEPS))
    return cfg, out


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(CLOCK)} for r in rows]


@pytest.mark.slow
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path, tiny_model_dir):
    cfg_a, out_a = _write_cfg(tmp_path, "straight", tiny_model_dir)
    subprocess.run(_cmd(cfg_a), env=_env(), check=True, capture_output=True, timeout=900)

    cfg_b, out_b = _write_cfg(tmp_path, "killed", tiny_model_dir)
    proc = subprocess.Popen(_cmd(cfg_b), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 600
        # Kill once step 2 is checkpointed, i.e. somewhere inside step 3 (rollout, update or logging).
        while not (out_b / "checkpoints" / "step_000002").exists():
            assert proc.poll() is None, "training exited before it could be killed"
            assert time.time() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        assert proc.poll() is None, "training finished before the kill; raise STEPS"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (out_b / "summary.json").exists()
    subprocess.run(_cmd(cfg_b), env=_env(), check=True, capture_output=True, timeout=900)

    a, b = _metrics(out_a), _metrics(out_b)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], rel=1e-5, abs=1e-6), (ra["step"], k)
    # The adapter actually learned something (the comparison is not between two untouched models).
    assert any(r.get("train/grad_norm", 0) > 0 for r in a)
    sa, sb = (json.loads((o / "summary.json").read_text()) for o in (out_a, out_b))
    for key in ("em_start", "em_final", "generated_tokens", "episodes", "steps"):
        assert sa[key] == sb[key], key
    # No episode lost or repeated: the data source ends at the same position.
    state_a = json.loads((out_a / "checkpoints" / f"step_{STEPS:06d}" / "state.json").read_text())
    state_b = json.loads((out_b / "checkpoints" / f"step_{STEPS:06d}" / "state.json").read_text())
    assert state_a["data_source"] == state_b["data_source"]
    assert (out_b / "curve.png").is_file()


def _in_process_cfg(tmp: Path, model: Path, name: str, *overrides: str):
    from memrl.config import load_config

    path = tmp / f"{name}.yaml"
    path.write_text(CONFIG.format(out=tmp / name, model=model, steps=2))
    return load_config(
        path,
        [
            "episode.reward=tests.train.train_fixtures:vowel_reward",
            "data.n_samples_per_prompt=2",  # copies of one prompt: distinct episodes, one group
            "train.replay={batch_size: 4, sft_weight: 0.5, min_reward: 0.0}",
            "train.eval_every=0",
            *overrides,
        ],
    )


def test_dumped_rollouts_replay_into_the_same_updates(tmp_path, tiny_model_dir):
    """data.dump_dir + train.train_only: training from the dump reproduces the live run's updates exactly,
    replay loss included; train.rollout_only dumps without touching the adapter."""
    import torch

    from memrl.train.loop import train
    from memrl.train.lora import adapter_state
    from memrl.train.setup import build_resources

    dumps = tmp_path / "dumps"
    live_cfg = _in_process_cfg(tmp_path, tiny_model_dir, "live", f"data.dump_dir={dumps}")
    live = build_resources(live_cfg)
    summary = train(live_cfg, resources=live)
    assert sorted(p.name for p in dumps.iterdir()) == ["rollout_000001.jsonl", "rollout_000002.jsonl"]
    assert summary["em_start_ci"][0] <= summary["em_start"] <= summary["em_start_ci"][1]

    replay_cfg = _in_process_cfg(tmp_path, tiny_model_dir, "replayed", f"train.train_only={dumps}")
    replayed = build_resources(replay_cfg)
    replay_summary = train(replay_cfg, resources=replayed)
    assert replay_summary["em_start"] is None  # no generation at all: no evaluation either
    rows = [_metrics(tmp_path / n) for n in ("live", "replayed")]
    steps = [[r for r in rs if "train/pg_loss" in r] for rs in rows]
    assert len(steps[0]) == len(steps[1]) == 2
    assert "replay/loss" in steps[0][1]  # the replay buffer ran inside the loop (step 2 samples step 1's)
    for a, b in zip(*steps, strict=True):
        for key in ("train/pg_loss", "train/grad_norm", "replay/loss", "rollout/groups_trained"):
            assert (key in a) == (key in b), key
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), key
    for (k, va), (_, vb) in zip(
        adapter_state(live.model).items(), adapter_state(replayed.model).items(), strict=True
    ):
        assert torch.allclose(va, vb, atol=1e-6), k

    only_cfg = _in_process_cfg(
        tmp_path, tiny_model_dir, "only", f"data.dump_dir={tmp_path / 'only'}", "train.rollout_only=true"
    )
    only = build_resources(only_cfg)
    before = {k: v.clone() for k, v in adapter_state(only.model).items()}
    train(only_cfg, resources=only)
    assert all(torch.equal(before[k], v) for k, v in adapter_state(only.model).items())
    assert len(list((tmp_path / "only").glob("rollout_*.jsonl"))) == 2


def test_gold_demonstrations_reach_the_replay_sft_term_inside_the_loop(tmp_path, tiny_model_dir):
    """train.replay.demonstrations=gold in the real loop: the runner's episodes carry the gold answer, the
    policy's tokenizer builds the demonstrations, and replay trains on them from step 2 on."""
    from memrl.train.demonstrations import GoldDemonstrations
    from memrl.train.loop import train
    from memrl.train.setup import build_resources

    # min_reward 2.0 is out of vowel_reward's reach: every replayed group gets a demonstration
    cfg = _in_process_cfg(
        tmp_path,
        tiny_model_dir,
        "gold",
        "train.replay={batch_size: 4, sft_weight: 0.5, min_reward: 2.0, demonstrations: gold}",
        "train.final_eval_episodes=1",
    )
    res = build_resources(cfg)
    assert isinstance(res.replay.demonstrate, GoldDemonstrations)
    assert res.replay.demonstrate.tokenizer is res.policy.tokenizer
    train(cfg, resources=res)
    step2 = [r for r in _metrics(tmp_path / "gold") if "train/pg_loss" in r][1]
    assert step2["replay/demo_rows"] >= 1 and step2["replay/sft_rows"] == step2["replay/demo_rows"]
    assert step2["replay/demo_token_logp"] < 0


def test_gold_program_demonstrations_and_tool_use_metrics_inside_the_loop(tmp_path, tiny_model_dir):
    """demonstrations=gold_program in the real loop: arithmetic questions are demonstrated as a python call of their
    gold program, run in the sandbox, its result masked; every step and evaluation logs how answers used tools."""
    import shutil

    from memrl.train.loop import train
    from memrl.train.setup import build_resources

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    cfg = _in_process_cfg(
        tmp_path,
        tiny_model_dir,
        "program",
        "train.replay={batch_size: 4, sft_weight: 0.5, min_reward: 2.0, demonstrations: gold_program}",
        "tools.enabled=[python]",
        "data.options={num_episodes: 12, num_sessions: 2, turns_per_session: 2, question_types: [arithmetic],"
        " arithmetic_range: [1000, 9999]}",
        "train.final_eval_episodes=1",
    )
    res = build_resources(cfg)
    train(cfg, resources=res)
    steps = [r for r in _metrics(tmp_path / "program") if "train/pg_loss" in r]
    assert steps[1]["replay/demo_rows"] >= 1 and steps[1]["replay/demo_token_logp"] < 0
    for key in ("calls_per_answer", "failed_calls", "rollbacks", "gold_calls", "copied_results"):
        assert f"tooluse/{key}" in steps[0] and f"eval/tooluse/{key}" in _metrics(tmp_path / "program")[-1]
    for demo in res.replay.sample(4).demonstrations:
        step = demo.steps[0]
        [call] = step.meta.tool_calls
        assert call.result == step.meta.gold_answer and call.arguments == step.meta.gold_python
        assert 0 in step.response_mask and step.response_mask[0] == 1


def test_progress_bars_cover_the_evaluations_and_the_steps(tmp_path, tiny_model_dir, capsys):
    """The start and final evaluations (minutes on real runs) and the steps each show a bar on stderr."""
    from memrl.train.loop import train
    from memrl.train.setup import build_resources

    cfg = _in_process_cfg(
        tmp_path, tiny_model_dir, "bars", "train.eval_every=1", "train.final_eval_episodes=3"
    )
    train(cfg, resources=build_resources(cfg), progress=True)
    err = capsys.readouterr().err
    assert "start eval: 100%" in err and "3/3" in err
    assert "final eval: 100%" in err
    assert "train: 100%" in err and "2/2" in err and "reward=" in err
    # In-run evaluations (eval_every=1) open a bar too, cleared once done.
    assert re.search(r"(?<!start )(?<!final )eval:\s+0%", err)
    quiet = _in_process_cfg(tmp_path, tiny_model_dir, "quiet", "train.final_eval_episodes=3")
    train(quiet, resources=build_resources(quiet))
    err = capsys.readouterr().err
    assert "eval:" not in err and "train:" not in err


def test_warm_start_imitates_gold_writes_before_the_first_step_as_step_zero(tmp_path, tiny_model_dir):
    """train.warm_start in the real loop: the gold writes of the first episodes are imitated before step 1,
    logged and checkpointed as step 0, and their time counts in the training budget."""
    from memrl.train.checkpoint import latest_checkpoint
    from memrl.train.loop import train
    from memrl.train.setup import build_resources

    cfg = _in_process_cfg(
        tmp_path,
        tiny_model_dir,
        "warm",
        "memory.extractor=policy",
        "memory.write_max_tokens=8",
        "episode.ingest_chunk_turns=2",
        "train.warm_start={episodes: 3, batch_size: 2}",
        "train.steps=1",
        "train.final_eval_episodes=1",
    )
    summary = train(cfg, resources=build_resources(cfg))
    rows = [json.loads(line) for line in (tmp_path / "warm" / "metrics.jsonl").read_text().splitlines()]
    warm = next(r for r in rows if "warm_start/demonstrations" in r)
    assert warm["step"] == 0
    assert (
        warm["warm_start/demonstrations"] == 3 * 2
    )  # 3 episodes, 2 sessions of 2 turns, one write per session
    assert warm["warm_start/steps"] == 3 and warm["warm_start/loss_last"] > 0
    assert summary["wall_s"] >= warm["counters/warm_start_s"] > 0
    assert summary["steps"] == 1 and latest_checkpoint(tmp_path / "warm" / "checkpoints") is not None
    # The imitation-only adapter is kept apart from the checkpoints (pruning removes step 0): step 0's weights.
    import torch
    from safetensors.torch import load_file

    kept = load_file(tmp_path / "warm" / "warm_start" / "adapter" / "adapter_model.safetensors")
    step0 = load_file(
        tmp_path / "warm" / "checkpoints" / "step_000000" / "adapter" / "adapter_model.safetensors"
    )
    assert kept.keys() == step0.keys() and all(torch.equal(kept[k], v) for k, v in step0.items())


def test_an_answer_warm_start_imitates_gold_programs_on_the_answer_adapter_before_step_one(
    tmp_path, tiny_model_dir
):
    """train.warm_start.role=answer in the real loop: each of the first episodes' target prompts gets its gold
    answer (a python call of its program where it has one), imitated on the answer adapter as step 0."""
    from safetensors.torch import load_file

    from memrl.train.loop import train
    from memrl.train.setup import build_resources

    cfg = _in_process_cfg(
        tmp_path,
        tiny_model_dir,
        "answer_warm",
        "data.options={num_episodes: 12, num_sessions: 2, turns_per_session: 2, question_types: [arithmetic, lookup]}",
        "tools.enabled=[python]",
        "train.replay.demonstrations=gold_program",
        "train.warm_start={episodes: 4, batch_size: 2, role: answer}",
        "train.kl_coef=0.1",
        "train.kl_reference=warm_start",
        "train.steps=1",
    )
    train(cfg, resources=build_resources(cfg))
    rows = [
        json.loads(line) for line in (tmp_path / "answer_warm" / "metrics.jsonl").read_text().splitlines()
    ]
    # The KL's reference is the warm-started adapter: step 1's single on-policy update starts on it.
    first = next(r for r in rows if r["step"] == 1 and "train/kl_ref" in r)
    assert first["train/kl_ref"] < 1e-6
    warm = next(r for r in rows if "warm_start/demonstrations" in r)
    assert warm["step"] == 0 and warm["warm_start/demonstrations"] == 4
    assert warm["warm_start/demos_program"] == 2 and warm["warm_start/demos_answer"] == 2
    assert warm["warm_start/steps"] == 2 and warm["warm_start/loss_first"] > 0
    # LoRA's B starts at zero: the SFT steps moved it.
    kept = load_file(tmp_path / "answer_warm" / "warm_start" / "adapter" / "adapter_model.safetensors")
    assert any(float(v.abs().sum()) > 0 for k, v in kept.items() if "lora_B" in k)


def test_kl_reference_start_anchors_rl_to_the_loaded_adapter(tmp_path, tiny_model_dir):
    """train.kl_reference=start: a run that goes on from a saved adapter (policy.lora_path) takes its KL to that
    adapter, so step 1's on-policy update starts at KL 0; to the base model it would not."""
    from memrl.train.loop import train
    from memrl.train.setup import build_resources

    task = ("data.options={num_episodes: 12, num_sessions: 2, turns_per_session: 2, question_types: [arithmetic]}",
            "tools.enabled=[python]", "train.replay.demonstrations=gold_program")  # fmt: skip
    warm = _in_process_cfg(tmp_path, tiny_model_dir, "imitated", *task, "train.steps=0",
                           "train.warm_start={episodes: 4, batch_size: 2, role: answer}")  # fmt: skip
    train(warm, resources=build_resources(warm))
    adapter = tmp_path / "imitated" / "warm_start" / "adapter"

    def first_kl(name: str, reference: str) -> float:
        cfg = _in_process_cfg(tmp_path, tiny_model_dir, name, *task, f"policy.lora_path={adapter}",
                              "train.kl_coef=0.1", f"train.kl_reference={reference}", "train.steps=1")  # fmt: skip
        train(cfg, resources=build_resources(cfg))
        rows = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        return next(r for r in rows if r["step"] == 1 and "train/kl_ref" in r)["train/kl_ref"]

    assert first_kl("anchored", "start") < 1e-6
    assert first_kl("to_base", "base") > 1e-5
    with pytest.raises(ValueError, match="kl_reference: start anchors RL .* set policy.lora_path"):
        build_resources(_in_process_cfg(tmp_path, tiny_model_dir, "nothing", "train.kl_coef=0.1",
                                        "train.kl_reference=start"))  # fmt: skip


def test_a_warm_start_under_its_check_gets_class_balanced_passes_and_logs_the_check(tmp_path, tiny_model_dir):
    """train.warm_start.check_episodes: the warm-started writer writes the next training episodes greedily and is
    scored against their gold operations; under min_recall (a random model's writes are all malformed NOOPs, so
    ADD and UPDATE recall are 0) it gets class-balanced passes, at most BALANCED_PASSES, all in step 0."""
    from memrl.train.loop import train
    from memrl.train.setup import build_resources
    from memrl.train.warm_start import BALANCED_PASSES

    cfg = _in_process_cfg(
        tmp_path,
        tiny_model_dir,
        "checked",
        "memory.extractor=policy",
        "memory.write_max_tokens=8",
        "episode.ingest_chunk_turns=1",
        "train.warm_start={episodes: 2, batch_size: 4, check_episodes: 1, min_recall: 0.5}",
        "train.steps=1",
        "train.final_eval_episodes=1",
    )
    train(cfg, resources=build_resources(cfg))
    rows = [json.loads(line) for line in (tmp_path / "checked" / "metrics.jsonl").read_text().splitlines()]
    warm = next(r for r in rows if "warm_start/demonstrations" in r)
    assert warm["step"] == 0 and warm["warm_start/balanced_passes"] == BALANCED_PASSES
    assert warm["warm_start/check_recall_ADD"] < 0.5 and warm["warm_start/check_lowest_recall"] < 0.5
    assert (
        warm["warm_start/steps"] == 2
    )  # 8 gold writes in batches of 4; the balanced passes are logged apart
    assert 0 < warm["time/warm_start_check_s"] < warm["time/warm_start_s"]


def test_start_eval_key_follows_content_not_seed(tmp_path):
    """Seeds of one setup share the cached untrained evaluation (it is greedy); a reworded question with the
    same episode id, or a reworded prompt template, gets its own."""
    import dataclasses
    from types import SimpleNamespace

    from memrl.adapters import LOCOMO_FIXTURE
    from memrl.data.adapters import run_adapter
    from memrl.train.loop import start_eval_key

    plain, _ = run_adapter("locomo", str(LOCOMO_FIXTURE), split="all", options={})
    official, _ = run_adapter(
        "locomo", str(LOCOMO_FIXTURE), split="all", options={"question_format": "official"}
    )
    assert [e.episode_id for e in plain] == [e.episode_id for e in official]
    cfg = _in_process_cfg(tmp_path, tmp_path / "model", "key")
    key = lambda c, inputs: start_eval_key(SimpleNamespace(cfg=c, final_eval_inputs=inputs))  # noqa: E731
    assert key(cfg, plain) == key(dataclasses.replace(cfg, seed=cfg.seed + 1), plain)
    assert key(cfg, plain) != key(cfg, official)
    assert key(cfg, plain) != key(
        dataclasses.replace(cfg, memory=dataclasses.replace(cfg.memory, top_k=3)), plain
    )
    # A template file whose text changes under the same name gets its own key: the config names it, not its text.
    from memrl.templates import template_source

    custom = tmp_path / "turn.j2"
    custom.write_text(template_source("target_turn.j2"))
    named = dataclasses.replace(cfg, episode=dataclasses.replace(cfg.episode, prompt_template=str(custom)))
    before = key(named, plain)
    custom.write_text(template_source("target_turn.j2").replace("using your memory", "from your notes"))
    assert key(named, plain) != before


def test_per_role_adapters_write_with_the_writers_adapter_and_imitate_into_it_only(tmp_path, tiny_model_dir):
    """train.role_adapters=per_role in the real loop: every memory write is generated with the writer's adapter,
    every answer with the answer adapter; the warm start's imitation of gold writes trains the writer's only, and
    the checkpoint holds both (the writer's in adapter/memory/)."""
    from safetensors.torch import load_file

    from memrl.train.loop import train
    from memrl.train.setup import build_resources

    cfg = _in_process_cfg(
        tmp_path, tiny_model_dir, "roles", "memory.extractor=policy", "memory.write_max_tokens=8",
        "episode.ingest_chunk_turns=2", "train.warm_start={episodes: 2, batch_size: 2}", "train.steps=1",
        "train.final_eval_episodes=1", "train.role_adapters=per_role", "train.keep_checkpoints=5",
    )  # fmt: skip
    res = build_resources(cfg)
    seen: list[tuple[str, bool]] = []  # (active adapter, is a write) per outer generate call
    generate, depth = res.policy.generate, [0]

    def spy(requests):  # outer calls only: a call computes shared prompt prefixes by a nested one
        if not depth[0]:
            seen.append((res.model.active_adapter, _is_write(res.policy.tokenizer, requests[0])))
        depth[0] += 1
        try:
            return generate(requests)
        finally:
            depth[0] -= 1

    res.policy.generate = spy
    train(cfg, resources=res)
    writes = {adapter for adapter, is_write in seen if is_write}
    answers = {adapter for adapter, is_write in seen if not is_write}
    assert writes == {"memory"} and answers == {"default"}
    step0 = tmp_path / "roles" / "checkpoints" / "step_000000" / "adapter"
    answer, writer = (
        load_file(step0 / "adapter_model.safetensors"),
        load_file(step0 / "memory" / "adapter_model.safetensors"),
    )
    assert all(not t.any() for k, t in answer.items() if "lora_B" in k)  # PEFT's B starts at 0: untouched
    assert any(t.any() for k, t in writer.items() if "lora_B" in k)


def _is_write(tokenizer, request) -> bool:
    """A memory write's prompt ends with the writer's cue (memrl.memory.writer.render_user)."""
    return "Operations:" in tokenizer.decode(list(request.prompt_ids)[-40:])


def test_a_writer_trained_by_imitation_only_is_the_warm_starts_writer_after_rl_steps(
    tmp_path, tiny_model_dir
):
    """train.roles=[answer] with no gold writes in the replay term (the shipped memory recipe): the RL steps and the
    replay SFT of answers leave the writer's adapter exactly as the warm start made it."""
    import torch
    from safetensors.torch import load_file

    from memrl.train.loop import train

    cfg = _in_process_cfg(
        tmp_path, tiny_model_dir, "frozen", "memory.extractor=policy", "memory.write_max_tokens=8",
        "episode.ingest_chunk_turns=2", "train.warm_start={episodes: 2, batch_size: 2}", "train.steps=2",
        "train.final_eval_episodes=1", "train.role_adapters=per_role", "train.keep_checkpoints=5",
        "train.roles=[answer]", "train.checkpoint_every=1",
        "train.replay={batch_size: 4, sft_weight: 0.5, demonstrations: gold, memory_demonstrations: false}",
    )  # fmt: skip
    train(cfg)
    ckpts = tmp_path / "frozen" / "checkpoints"
    first, last = ckpts / "step_000000" / "adapter", ckpts / "step_000002" / "adapter"
    w0, w2 = (load_file(d / "memory" / "adapter_model.safetensors") for d in (first, last))
    a0, a2 = (load_file(d / "adapter_model.safetensors") for d in (first, last))
    assert w0.keys() == w2.keys() and all(torch.equal(w0[k], w2[k]) for k in w0)
    assert any(not torch.equal(a0[k], a2[k]) for k in a0)  # the answer role did train


def test_training_starts_from_the_adapter_policy_lora_path_names(tmp_path, tiny_model_dir):
    """policy.lora_path in training: both roles' adapters start from the saved ones (a writer warm-started in one
    run beside an answer adapter trained in another); a directory without the writer's adapter is refused."""
    import torch

    from memrl.train.lora import adapter_state, save_adapter
    from memrl.train.setup import build_resources

    roles = ("memory.extractor=policy", "train.role_adapters=per_role")
    saved = build_resources(_in_process_cfg(tmp_path, tiny_model_dir, "a", *roles))
    with torch.no_grad():
        for i, (name, p) in enumerate(saved.model.named_parameters()):
            if "lora_B" in name:
                p.add_(0.01 * (i + 1))
    save_adapter(saved.model, tmp_path / "saved")
    want = {a: adapter_state(saved.model, a) for a in ("default", "memory")}

    res = build_resources(
        _in_process_cfg(tmp_path, tiny_model_dir, "b", *roles, f"policy.lora_path={tmp_path / 'saved'}")
    )
    for adapter, tensors in want.items():
        got = adapter_state(res.model, adapter)
        assert got.keys() == tensors.keys()
        assert all(torch.equal(got[k], tensors[k]) for k in tensors), adapter
    assert any(t.any() for k, t in adapter_state(res.model, "memory").items() if "lora_B" in k)

    (tmp_path / "answer_only").mkdir()
    for f in (tmp_path / "saved").iterdir():
        if f.is_file():
            (tmp_path / "answer_only" / f.name).write_bytes(f.read_bytes())
    with pytest.raises(FileNotFoundError, match="adapter 'memory'"):
        build_resources(
            _in_process_cfg(
                tmp_path, tiny_model_dir, "c", *roles, f"policy.lora_path={tmp_path / 'answer_only'}"
            )
        )


def test_no_start_or_final_evaluation_with_final_eval_episodes_zero(tmp_path, tiny_model_dir):
    """train.final_eval_episodes=0: the run trains and checkpoints without the start and final evaluations."""
    from memrl.train.checkpoint import latest_checkpoint
    from memrl.train.loop import train

    cfg = _in_process_cfg(tmp_path, tiny_model_dir, "noeval", "train.final_eval_episodes=0", "train.steps=1")
    summary = train(cfg)
    assert summary["steps"] == 1 and summary["em_start"] is None and summary["em_final"] is None
    rows = _metrics(tmp_path / "noeval")
    assert rows and not any(k.startswith("eval/") for r in rows for k in r)
    assert latest_checkpoint(tmp_path / "noeval" / "checkpoints") is not None


def test_memrl_train_ends_with_the_before_after_table_of_its_summary(tmp_path, tiny_model_dir, capsys):
    """`memrl train` prints the held-out table (strict, lenient, F1 before and after, from summary.json), the
    run dir and the next commands; the final evaluation's episodes are a directory `memrl inspect` reads."""
    from memrl.cli.main import main
    from memrl.inspect import load_run

    cfg = tmp_path / "table.yaml"
    cfg.write_text(CONFIG.format(out=tmp_path / "table", model=tiny_model_dir, steps=1))
    args = [
        "train",
        "--config",
        str(cfg),
        "--no-progress",
        "train.final_eval_episodes=3",
        "train.eval_every=0",
    ]
    assert main([*args, "episode.reward=tests.train.train_fixtures:vowel_reward"]) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "table" / "summary.json").read_text())
    assert summary["eval_episodes"] == 3 and summary["memory"] == "memory" and summary["eval_split"] == "test"
    for key in ("em", "lenient_match", "token_f1"):
        for when in ("start", "final"):
            value, (low, high) = summary[f"{key}_{when}"], summary[f"{key}_{when}_ci"]
            assert 0.0 <= low <= value <= high <= 1.0
    lines = out.splitlines()
    assert lines[0] == "held-out test split: 3 episodes, memory on; 1 step, " + lines[0].split("step, ")[1]
    # the reward's row is named by the reward, then lenient and F1, each with the summary's numbers
    vowels = next(line for line in lines if line.startswith("tests.train.train_fixtures:vowel_reward"))
    assert f"{summary['em_start']:.3f} ({summary['em_start_ci'][0]:.3f}-" in vowels
    assert f"{summary['em_final']:.3f}" in vowels
    lenient = next(line for line in lines if line.startswith("lenient")).split()
    assert lenient[1] == f"{summary['lenient_match_start']:.3f}"
    assert lenient[3] == f"{summary['lenient_match_final']:.3f}"
    assert f"run dir: {tmp_path / 'table'}" in out
    assert summary["adapter"] == str(tmp_path / "table" / "checkpoints" / "step_000001" / "adapter")
    assert f"memrl eval --config EVAL_CONFIG policy.lora_path={summary['adapter']}" in out
    assert f"memrl inspect {summary['eval_dir']}" in out
    run = load_run(summary["eval_dir"])
    assert len(run.episode_views()) == 3
    assert "{" not in out  # the summary JSON only with --json
