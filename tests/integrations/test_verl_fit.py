"""verl 0.9's real ``RayPPOTrainer.fit`` for 2 steps on CPU with memrl's agent loop: verl's hydra config,
``RLHFDataset``, ``AgentLoopManager`` / ``AgentLoopWorker`` (Ray actors) and GRPO; only the LLM server, the actor
worker group and ``update_weights`` are CPU stand-ins (tests/integrations/verl_fit_standins.py).

3 prompts x 2 samples over 2 agent-loop workers: verl cuts the 6 samples into 2 contiguous chunks of 3, so the
middle prompt's samples run on different workers (one memrl episode per share); GRPO still groups by uid."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

pytest.importorskip("verl.trainer.ppo.ray_trainer", reason="verl's trainer not importable (.ci/verl.sh)")
pytestmark = [pytest.mark.verl, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
N = 2
PROMPTS = 3
WORKERS = 2
MEMRL_OVERRIDES = [
    "data.adapter=synthetic",
    f"data.options={{num_episodes: {PROMPTS}, num_sessions: 2, turns_per_session: 2}}",
    "tools.enabled=[]",
    "rollout.max_response_tokens=8",
    "episode.prompt_token_budget=400",
    "episode.reward=char_similarity",  # varies with the random model's noise: GRPO advantages are non-zero
]


def _write_model_and_data(tmp: Path, memrl_overrides=MEMRL_OVERRIDES):
    from memrl.config import load_config
    from memrl.data.adapters import load_dataset
    from memrl.integrations.verl import verl_dataset_rows
    from memrl.testing import random_tiny_llama

    model, tok = random_tiny_llama(0)
    model.save_pretrained(tmp / "model")
    tok.save_pretrained(tmp / "model")
    inputs, _ = load_dataset(load_config(None, memrl_overrides).data)
    pd.DataFrame(verl_dataset_rows(inputs)).to_parquet(tmp / "train.parquet")
    (tmp / "agent.yaml").write_text(
        "- name: memrl\n  _target_: memrl.integrations.verl_agent_loop.MemrlAgentLoop\n"
    )
    return model, tok, inputs


def _verl_config(
    tmp: Path,
    use_v1: bool = False,
    extra=(),
    memrl_overrides=MEMRL_OVERRIDES,
    estimator: str = "grpo",
    steps: int = 2,
    prompt_length: int = 512,
):
    import verl
    from hydra import compose, initialize_config_dir

    cfgdir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    overrides = [
        f"algorithm.adv_estimator={estimator}",
        "trainer.device=cpu",
        f"trainer.use_v1={str(use_v1).lower()}",
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        "trainer.logger=[console]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.resume_mode=disable",
        f"trainer.total_training_steps={steps}",
        "trainer.balance_batch=false",
        f"trainer.default_local_dir={tmp}/ckpt",
        f"data.train_files={tmp}/train.parquet",
        f"data.val_files={tmp}/train.parquet",
        f"data.train_batch_size={PROMPTS}",
        f"data.max_prompt_length={prompt_length}",
        "data.max_response_length=16",
        "data.filter_overlong_prompts=false",
        "data.shuffle=false",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={tmp}/model",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.rollout.name=vllm",
        f"actor_rollout_ref.rollout.n={N}",
        f"actor_rollout_ref.rollout.agent.num_workers={WORKERS}",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={tmp}/agent.yaml",
        "actor_rollout_ref.rollout.agent.default_agent_loop=memrl",
        "algorithm.use_kl_in_reward=false",
        "+memrl.config=null",
        "+memrl.overrides=[" + ",".join(f"'{o}'" for o in memrl_overrides) + "]",
        *extra,
    ]
    with initialize_config_dir(config_dir=cfgdir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """One Ray cluster for both trainers' runs (starting a second one on a busy machine can time out)."""
    import ray

    ray_tmp = Path(os.environ.get("RAY_TMPDIR") or tmp_path_factory.mktemp("ray"))
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        _temp_dir=str(ray_tmp),
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT), "MEMRL_CACHE_DIR": os.environ["MEMRL_CACHE_DIR"]}},
    )
    yield
    ray.shutdown()


def test_fit_two_steps_with_memrl_agent_loop(tmp_path, ray_cluster, monkeypatch):
    from verl.experimental.agent_loop import AgentLoopManager
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.trainer.ppo.utils import Role
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.utils.tracking import Tracking

    from tests.integrations.verl_fit_standins import TinyActorGroup, TinyServer, TinyServerClient, WeightSync

    model, tok, inputs = _write_model_and_data(tmp_path)
    config = _verl_config(tmp_path)
    logged: list[dict] = []
    monkeypatch.setattr(Tracking, "log", lambda self, data, step, **kw: logged.append(dict(data, step=step)))

    dataset = RLHFDataset(data_files=[str(tmp_path / "train.parquet")], tokenizer=tok, config=config.data)
    trainer = RayPPOTrainer(
        config=config,
        tokenizer=tok,
        role_worker_mapping={Role.ActorRollout: object},
        resource_pool_manager=SimpleNamespace(get_n_gpus=lambda: 1),  # read for throughput metrics only
        train_dataset=dataset,
        val_dataset=dataset,
        collate_fn=collate_fn,
    )
    server = TinyServer.remote(str(tmp_path / "model"))
    actor = TinyActorGroup(model)
    sync = WeightSync(actor, server)
    trainer.actor_rollout_wg = actor
    trainer.checkpoint_manager = sync
    trainer.async_rollout_manager = AgentLoopManager.create(
        config=config, llm_client=TinyServerClient(server)
    )
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}

    trainer.fit()

    assert sync.calls == [0, 1, 2]  # once before training, once after each update
    _check_run(model, before, actor, logged, tok, inputs, split=True)


def _check_run(model, before, actor, logged, tok, inputs, *, split: bool):
    """What both trainers must show: rollout and actor log-probs equal (weights synced), weights changed,
    memrl's rewards and verl's uid groups at the actor."""
    assert len(actor.updates) == 2
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    steps = [m for m in logged if "training/rollout_probs_diff_max" in m]
    assert len(steps) == 2 and all(m["training/rollout_probs_diff_max"] < 1e-5 for m in steps), steps
    from memrl.rewards.base import RewardInput, make_reward

    reward = make_reward("char_similarity")
    in_order = [
        inp.target_answer for inp in inputs for _ in range(N)
    ]  # the legacy trainer keeps verl's order
    for update in actor.updates:
        gold = update.get("gold", in_order)  # the v1 trainer reorders its batch (seq-length balancing)
        mask, adv, scores = update["response_mask"].bool(), update["advantages"], update["token_level_scores"]
        assert mask.shape[0] == len(inputs) * N and torch.isfinite(adv).all()
        # the reward that reaches the actor is memrl's reward of the response the actor trains on
        texts = [
            tok.decode(r[m].tolist(), skip_special_tokens=True)
            for r, m in zip(update["responses"], mask, strict=True)
        ]
        ours = reward([RewardInput.from_response(t, g, "", {}) for t, g in zip(texts, gold, strict=True)])
        assert scores.sum(-1).tolist() == pytest.approx(ours, abs=1e-6)
        # GRPO groups are verl's uids: each prompt's N samples have zero-mean advantages
        rows: dict[str, list[int]] = {}
        for i, uid in enumerate(update["uid"]):
            rows.setdefault(uid, []).append(i)
        assert sorted(map(len, rows.values())) == [N] * PROMPTS
        for idx in rows.values():
            assert sum(float(adv[i][mask[i]][0]) for i in idx if mask[i].any()) == pytest.approx(0, abs=1e-4)
        sizes = sorted(tuple(update["memrl_group_size"][i] for i in idx) for idx in rows.values())
        if split:  # the middle prompt's 2 samples ran on the 2 workers, each as its own 1-leaf episode
            assert update["memrl_group_size"] == [2, 2, 1, 1, 2, 2] and sizes == [(1, 1), (2, 2), (2, 2)]
        else:  # each worker runs all n samples of its own prompts
            assert sizes == [(N,) * N] * PROMPTS
    assert np.isfinite([m["actor/pg_loss"] for m in steps]).all()


def test_fit_two_steps_with_the_v1_trainer(tmp_path, ray_cluster, monkeypatch):
    """verl's v1 trainer (``trainer.use_v1=true``, sync mode): batches move through TransferQueue, the agent-loop
    workers spawn each prompt's n samples themselves and put them into TransferQueue."""
    model, tok, inputs = _write_model_and_data(tmp_path)
    config = _verl_config(tmp_path, use_v1=True)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    actor, sync, logged = _fit_v1(tmp_path, config, model, monkeypatch)
    assert sync.calls == [0, 1, 2]  # once before training, once after each update
    _check_run(model, before, actor, logged, tok, inputs, split=False)


def _fit_v1(tmp_path, config, model, monkeypatch, lora_rank: int = 0):
    """``PPOTrainerSync.fit`` with TransferQueue and the CPU stand-ins; returns the actor, the weight sync and the
    logged metrics."""
    tq = pytest.importorskip("transfer_queue", reason="the v1 trainer needs TransferQueue (.ci/verl.sh)")
    from verl.trainer.ppo.v1 import AgentLoopManagerTQ, get_trainer_cls
    from verl.utils.tracking import Tracking

    from tests.integrations.verl_fit_standins import (
        TinyActorGroupTQ,
        TinyServer,
        TinyServerClient,
        WeightSync,
    )

    logged: list[dict] = []
    monkeypatch.setattr(Tracking, "log", lambda self, data, step, **kw: logged.append(dict(data, step=step)))
    config.transfer_queue.enable = True
    tq.init(config.transfer_queue)
    try:
        trainer = get_trainer_cls(config.trainer.v1.trainer_mode)(config=config)
        # PPOTrainer._setup without its GPU pieces: tokenizer, dataloaders, then the stand-ins
        trainer._init_tokenizer()
        trainer._init_dataloader()
        trainer._init_dump_executor()
        trainer.resource_pool_manager = SimpleNamespace(get_n_gpus=lambda: 1)
        trainer.ref_in_actor = False
        trainer.teacher_model_manager = None
        # memrl scores in the loop
        trainer.reward_loop_manager = SimpleNamespace(reward_loop_worker_handles=[])
        server = TinyServer.remote(str(tmp_path / "model"))
        actor = TinyActorGroupTQ(model, lora_rank=lora_rank)
        sync = WeightSync(actor, server)
        trainer.actor_rollout_wg = actor
        trainer.checkpoint_manager = sync
        trainer._load_checkpoint()
        trainer.on_init_end()
        manager = AgentLoopManagerTQ.create(
            config=config, llm_client=TinyServerClient(server), reward_loop_worker_handles=[]
        )
        trainer.fit(manager)
    finally:
        tq.close()
    return actor, sync, logged


WRITER_OVERRIDES = [
    *MEMRL_OVERRIDES,
    "memory.extractor=policy",
    "memory.write_max_tokens=8",
    "memory.write_neighbours=2",
    "memory.neighbour_turns=0",
    "episode.record_history_turns=false",
    "episode.ingest_chunk_turns=1",  # one write per history turn: 4 per episode
    "episode.memory_credit.name=used",  # one group per prompt's writes; the op term tells them apart
    "train.roles=[answer,memory]",
    "train.role_adapters=shared",
]


def test_fit_three_steps_with_the_policy_writing_memory(tmp_path, ray_cluster, monkeypatch):
    """The v1 trainer trains memrl's writer and answerer in one update: each sample returns its credited writes
    and its answer, memrl's hook restores the writes' own rewards and memrl_step_credit gives every memrl group
    its own GRPO advantages."""
    from memrl.integrations.verl_credit import ESTIMATOR, MODULE

    model, tok, inputs = _write_model_and_data(tmp_path, WRITER_OVERRIDES)
    config = _verl_config(
        tmp_path,
        use_v1=True,
        extra=[f"actor_rollout_ref.model.external_lib={MODULE}"],
        memrl_overrides=WRITER_OVERRIDES,
        estimator=ESTIMATOR,
        steps=3,
        prompt_length=2048,
    )
    # one LoRA for both roles, as verl's actor_rollout_ref.model.lora_rank gives (the writer's is the shared one)
    actor, sync, logged = _fit_v1(tmp_path, config, model, monkeypatch, lora_rank=4)

    assert sync.calls == [0, 1, 2, 3] and len(actor.updates) == 3
    steps = [m for m in logged if "training/rollout_probs_diff_max" in m]
    assert len(steps) == 3 and all(m["training/rollout_probs_diff_max"] < 1e-5 for m in steps), steps
    history = [len(inp.history) for inp in inputs]
    for update, m in zip(actor.updates, steps, strict=True):
        roles, groups = update["memrl_role"], update["memrl_credit_group"]
        assert roles.count("answer") == PROMPTS * N and roles.count("memory") == sum(history)
        assert m["answer/rows"] == PROMPTS * N and m["memory/rows"] == sum(history)
        mask, adv, scores = update["response_mask"].bool(), update["advantages"], update["token_level_scores"]
        # each row trains on its own memrl reward: a write's credit, not its sample's answer reward
        assert scores.sum(-1).tolist() == pytest.approx(update["memrl_reward"], abs=1e-6)
        rows: dict[str, list[int]] = {}
        for i, g in enumerate(groups):
            rows.setdefault(g, []).append(i)
        assert sum(g.endswith("/memory") for g in rows) == PROMPTS  # one memory group per prompt (used)
        for idx in rows.values():  # memrl's GRPO per memrl group
            seq = [float(adv[i][mask[i]][0]) for i in idx if mask[i].any()]
            assert sum(seq) == pytest.approx(0, abs=1e-4)
    writes_adv = [m["memory/adv_abs_mean"] for m in steps]
    assert max(writes_adv) > 0, "no write had an advantage: the writer was not trained"
    delta = actor.lora_delta()
    # each update moved the writes' log-probs along memrl's credit: up where the advantage is positive
    writer = [_writer_ascent(update) for update in actor.updates]
    assert delta > 0 and sum(writer) > 0, writer
    print(
        "\nverl v1 fit, policy-written memory:",
        *(
            f"step {m['step']}: answer rows {m['answer/rows']:.0f} reward {m['answer/reward_mean']:.3f} "
            f"adv|.| {m['answer/adv_abs_mean']:.3f}; memory rows {m['memory/rows']:.0f} reward "
            f"{m['memory/reward_mean']:.3f} adv|.| {m['memory/adv_abs_mean']:.3f}; step {m['timing_s/step']:.1f} s"
            for m in steps
        ),
        f"LoRA delta (L2 of scaling·B@A, all layers) {delta:.4f}; per step, Σ over writes of advantage × "
        f"change of the write's log-prob: {', '.join(f'{w:+.2e}' for w in writer)}",
        sep="\n",
    )


def _writer_ascent(update) -> float:
    """Σ over the step's memory rows of advantage × the change of the row's log-prob that step's update made:
    positive when the writer moved towards its better-credited writes."""
    rows = zip(
        update["advantages"],
        update["response_mask"],
        update["logprob_change"],
        update["memrl_role"],
        strict=True,
    )
    return float(sum(adv[mask.bool()][0] * moved for adv, mask, moved, role in rows if role == "memory"))
