"""Parity of memrl's step credit in verl with ``memrl train``, per credit name.

The same episodes (memory written by a scripted policy, real MiniLM + FAISS) go two ways:

* ``memrl train``'s: :func:`memrl.train.roles.keep_roles` → :class:`~memrl.data.batch.TrajectoryBatchBuilder` →
  :func:`memrl.train.advantages.compute_advantages` over the batch's groups and :func:`sample_weights`;
* verl's: each leaf → the agent loop's outputs (:meth:`MemrlAgentLoop.row_output`) → verl's own
  ``AgentLoopWorkerTQ._agent_loop_postprocess`` (which copies the last output's reward onto the others; what it
  puts into TransferQueue is captured) → the rows as the v1 trainer's ``_compute_advantage`` reads them, with
  memrl's hook restoring each row's reward → verl's ``compute_advantage_for_multi_trajectories`` with
  ``adv_estimator=memrl_step_credit``.

Every trained row (ids, mask, rollout log-probs, token advantages) must be equal, and no other row may reach verl.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import ByT5Tokenizer

pytest.importorskip("transfer_queue", reason="verl's v1 trainer needs TransferQueue (.ci/verl.sh)")
pytest.importorskip("verl.trainer.ppo.v1", reason="verl's v1 trainer not importable (.ci/verl.sh)")
from omegaconf import OmegaConf  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.trainer.ppo.v1 import agent_loop_tq  # noqa: E402
from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories  # noqa: E402

from memrl.config import load_config  # noqa: E402
from memrl.data.adapters import load_dataset  # noqa: E402
from memrl.data.batch import TrajectoryBatchBuilder, unpack_steps  # noqa: E402
from memrl.data.config import BatchConfig  # noqa: E402
from memrl.episode.build import build_runner  # noqa: E402
from memrl.integrations import verl_credit  # noqa: E402
from memrl.integrations.verl_agent_loop import MemrlAgentLoop, _Leaf  # noqa: E402
from memrl.integrations.verl_rows import leaf_rows  # noqa: E402
from memrl.testing.scripted import ScriptedPolicy  # noqa: E402
from memrl.train.advantages import compute_advantages, sample_weights  # noqa: E402
from memrl.train.roles import keep_roles  # noqa: E402
from tests.integrations.verl_standins import memory_script  # noqa: E402

pytestmark = pytest.mark.verl
CREDITS = ("broadcast", "used", "snapshot", "local")


def _cfg(credit: str, roles: str = "[answer,memory]", advantage: str = "grpo"):
    return load_config(
        None,
        [
            "data.options={num_episodes: 3}",
            "tools.enabled=[]",
            "rollout.n=2",
            "rollout.max_response_tokens=48",
            "memory.extractor=policy",
            "memory.write_max_tokens=400",
            "memory.top_k=4",
            "memory.neighbour_turns=0",
            "episode.record_history_turns=false",
            "episode.ingest_chunk_turns=6",
            "episode.reward=char_similarity",
            f"episode.memory_credit.name={credit}",
            "episode.memory_credit.snapshot_k=2",
            "episode.memory_credit.snapshot_writes=1",
            f"train.roles={roles}",
            "train.role_adapters=shared",
            f"train.advantage={advantage}",
        ],
    )


def _verl_rows(leaves, roles):
    """What verl's v1 trainer puts into TransferQueue for these leaves (one agent-loop run per leaf)."""
    loop = MemrlAgentLoop.__new__(MemrlAgentLoop)
    loop.rollout_config = SimpleNamespace(prompt_length=100_000, response_length=100_000)
    worker_cls = agent_loop_tq.AgentLoopWorkerTQ.__ray_metadata__.modified_class
    worker = SimpleNamespace(
        reward_loop_worker_handles=[], distillation_enabled=False, processor=None, tokenizer=None
    )
    for name in ("_compute_score", "_compute_teacher_logprobs", "_compute_multi_modal_inputs"):
        setattr(worker, name, getattr(worker_cls, name).__get__(worker))
    worker._compute_position_ids = worker_cls._compute_position_ids.__get__(worker)
    put: list = []

    async def capture(keys, fields, tags, partition_id):
        put.append((keys, fields))

    # the rows as dicts, before verl stacks them into one TensorDict for TransferQueue
    original = agent_loop_tq.tq.async_kv_batch_put, agent_loop_tq.list_of_dict_to_tensordict
    agent_loop_tq.tq.async_kv_batch_put, agent_loop_tq.list_of_dict_to_tensordict = capture, list
    try:
        for session, leaf in enumerate(leaves):
            outputs = [loop.row_output(_Leaf(leaf, {}, 2), row) for row in leaf_rows(leaf, roles)]
            if outputs:
                post = worker_cls._agent_loop_postprocess(
                    worker, outputs, False, uid=leaf.group_id, session_id=session, global_steps=1
                )
                asyncio.run(post)
    finally:
        agent_loop_tq.tq.async_kv_batch_put, agent_loop_tq.list_of_dict_to_tensordict = original
    keys = [k for ks, _ in put for k in ks]
    fields = [f for _, fs in put for f in fs]
    return keys, fields


def _verl_advantages(keys, fields, advantage="grpo"):
    """The v1 trainer's _compute_advantage on these rows, with memrl's hook (rewards restored, groups given)."""
    credit = verl_credit.RowCredit.from_extra_fields([f["extra_fields"] for f in fields], advantage)
    scores = verl_credit.restored_scores([f["rm_scores"] for f in fields], credit)
    pad = torch.nn.utils.rnn.pad_sequence
    data = DataProto.from_dict(
        tensors={
            "token_level_rewards": pad(scores, batch_first=True),
            "response_mask": pad([f["response_mask"] for f in fields], batch_first=True),
        },
        non_tensors={"uid": np.array([f["uid"] for f in fields], dtype=object)},
    )
    with verl_credit.rows_credited(credit):
        out = compute_advantage_for_multi_trajectories(
            data, batch_keys=keys, adv_estimator=verl_credit.ESTIMATOR, config=OmegaConf.create({})
        )
    return out.batch["advantages"], credit


@pytest.fixture(scope="module")
def policy():
    return ScriptedPolicy(ByT5Tokenizer(), memory_script)


@pytest.mark.parametrize(
    ("credit", "advantage"), [*((c, "grpo") for c in CREDITS), ("used", "drgrpo"), ("local", "rloo")]
)
def test_verl_trains_the_rows_and_advantages_of_memrl_train(credit, advantage, policy):
    cfg = _cfg(credit, advantage=advantage)
    inputs, _ = load_dataset(cfg.data)
    episodes = build_runner(cfg, policy=policy).run_batch(inputs)

    # memrl train
    batch = TrajectoryBatchBuilder(BatchConfig()).build(keep_roles(episodes, cfg.train.roles))
    weights = sample_weights(batch.step_meta)
    adv = compute_advantages(cfg.train.advantage, batch.rewards, batch.group_ids, weights)
    expected = {row.step_id: (row, float(adv[i])) for i, row in enumerate(unpack_steps(batch))}
    assert any("/memory" in g for g in batch.group_ids), "the run wrote no credited memory"
    assert any(a != 0 for _, a in expected.values())

    # verl
    keys, fields = _verl_rows(episodes, cfg.train.roles)
    verl_adv, credit_rows = _verl_advantages(
        keys, fields, verl_credit.memrl_advantage(_section(cfg, advantage))
    )
    got_ids = [f["extra_fields"]["memrl_step_id"] for f in fields]
    assert sorted(got_ids) == sorted(expected), "verl's rows are not memrl's trained rows"
    for i, (field, step_id) in enumerate(zip(fields, got_ids, strict=True)):
        row, a = expected[step_id]
        n = len(row.response_ids)
        assert field["prompts"].tolist() == list(row.prompt_ids)
        assert field["responses"].tolist() == list(row.response_ids)
        assert field["response_mask"].tolist() == list(row.response_mask)
        assert field["rollout_log_probs"].tolist() == pytest.approx(list(row.logprobs))
        want = torch.tensor(row.response_mask, dtype=torch.float32) * a
        assert verl_adv[i, :n].tolist() == pytest.approx(want.tolist(), abs=1e-5), step_id
    assert set(credit_rows.roles) == {"answer", "memory"}
    metrics = credit_rows.metrics
    assert metrics["memory/rows"] == sum(r == "memory" for r in credit_rows.roles)
    assert metrics["answer/rows"] == sum(r == "answer" for r in credit_rows.roles)


def test_verl_overwrites_the_writes_rewards_and_the_hook_restores_them(policy):
    """The verl line the hook undoes: the writes reach TransferQueue with the answer's reward."""
    cfg = _cfg("used")
    episodes = build_runner(cfg, policy=policy).run_batch(load_dataset(cfg.data)[0])
    keys, fields = _verl_rows(episodes, cfg.train.roles)
    credit = verl_credit.RowCredit.from_extra_fields([f["extra_fields"] for f in fields])
    restored = verl_credit.restored_scores([f["rm_scores"] for f in fields], credit)
    overwritten = 0
    for f, r, own in zip(fields, restored, credit.rewards, strict=True):
        overwritten += float(f["rm_scores"][-1]) != pytest.approx(own)
        assert float(r[-1]) == pytest.approx(own) and float(r[:-1].abs().sum()) == 0
    assert overwritten > 0  # some write's credit differs from its answer's reward


def test_one_role_drops_the_other_roles_rows(policy):
    cfg = _cfg("local", roles="[memory]")
    episodes = build_runner(cfg, policy=policy).run_batch(load_dataset(cfg.data)[0])
    _, fields = _verl_rows(episodes, cfg.train.roles)
    assert fields and {f["extra_fields"]["memrl_role"] for f in fields} == {"memory"}
    batch = TrajectoryBatchBuilder(BatchConfig()).build(keep_roles(episodes, ["memory"]))
    assert sorted(f["extra_fields"]["memrl_step_id"] for f in fields) == sorted(batch.step_ids)


def test_a_changed_verl_line_fails_loudly(monkeypatch):
    lines = list(verl_credit.VERL_LINES)
    module, qualname, expected = lines[0]
    lines[0] = (module, qualname, (*expected, "a line verl 0.9.1 does not have"))
    monkeypatch.setattr(verl_credit, "VERL_LINES", tuple(lines))
    with pytest.raises(verl_credit.VerlVersionError, match="_agent_loop_postprocess no longer contains"):
        verl_credit.check_verl_lines()


def _section(cfg, advantage):
    """verl's config as the hook reads memrl's train.advantage from it."""
    return OmegaConf.create({"memrl": {"config": None, "overrides": [f"train.advantage={advantage}"]}})


def test_unknown_memrl_advantage_lists_the_choices():
    with pytest.raises(verl_credit.VerlCreditError, match="expected one of.*grpo"):
        verl_credit.RowCredit.from_extra_fields([{"memrl_credit_group": "g"}], "ppo")
