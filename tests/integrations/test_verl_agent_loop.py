"""MemrlAgentLoop inside verl's agent-loop interface (verl 0.9): instantiated as verl's AgentLoopWorker does, the
samples of one step run concurrently, and each returns verl's AgentLoopOutput for one memrl leaf. A scripted policy
behind a stand-in server client makes tool calls (real sandbox, rollback); the rows come through Parquet and verl's
own RLHFDataset."""

from __future__ import annotations

import asyncio
import dataclasses
import re

import pandas as pd
import pytest
from transformers import ByT5Tokenizer

pytest.importorskip("verl.experimental.agent_loop", reason="verl's agent loop not importable (.ci/verl.sh)")
from omegaconf import OmegaConf  # noqa: E402
from verl.experimental.agent_loop.agent_loop import (  # noqa: E402
    AgentLoopOutput,
    DictConfigWrap,
    _agent_loop_registry,
)

from memrl.config import load_config  # noqa: E402
from memrl.data.adapters import load_dataset  # noqa: E402
from memrl.episode.build import build_runner  # noqa: E402
from memrl.integrations.verl import verl_dataset_rows  # noqa: E402
from memrl.integrations.verl_agent_loop import (  # noqa: E402
    MemrlAgentLoop,
    VerlConfigError,
    check_worker_split,
    shutdown_services,
)
from memrl.testing import CHAT_TEMPLATE  # noqa: E402
from memrl.testing.scripted import ScriptedPolicy  # noqa: E402
from tests.integrations.verl_standins import (  # noqa: E402
    PolicyServerClient,
    memory_script,
    rollback_script,
)

pytestmark = pytest.mark.verl
N = 2
OVERRIDES = [
    "data.adapter=synthetic",
    "data.options={num_episodes: 2}",
    "tools.enabled=[python]",
    "rollout.max_response_tokens=200",
    "rollout.rollback.enable_tool_rollback=true",
    "episode.reward=composite",
    "episode.reward_options={parts: {exact_match: 1.0, format: 0.5}}",
]


@pytest.fixture
def tok():
    tok = ByT5Tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _verl_config(overrides=OVERRIDES, response_length=256, prompt_length=2048):
    return OmegaConf.create(
        {
            "actor_rollout_ref": {
                "rollout": {"prompt_length": prompt_length, "response_length": response_length}
            },
            "data": {},
            "memrl": {"config": None, "overrides": list(overrides)},
        }
    )


def _agent(config, server, tok):
    """As AgentLoopWorker._run_agent_loop builds one (hydra.utils.instantiate of the registry entry)."""
    import hydra

    return hydra.utils.instantiate(
        config=_agent_loop_registry["memrl"],
        trainer_config=DictConfigWrap(config),
        server_manager=server,
        tokenizer=tok,
        processor=None,
        hf_model_type=None,
        dataset_cls=None,
        data_config=DictConfigWrap(config.data),
        tools=None,
    )


def _rows_through_verl_dataset(tmp_path, tok, overrides=OVERRIDES):
    from verl.utils.dataset.rl_dataset import RLHFDataset

    inputs, _ = load_dataset(load_config(None, overrides).data)
    path = tmp_path / "train.parquet"
    pd.DataFrame(verl_dataset_rows(inputs)).to_parquet(path)
    data_cfg = OmegaConf.create(
        {"prompt_key": "prompt", "max_prompt_length": 512, "filter_overlong_prompts": False}
    )
    dataset = RLHFDataset(data_files=[str(path)], tokenizer=tok, config=data_cfg)
    return inputs, [dataset[i] for i in range(len(dataset))]


def test_registered_and_runs_episodes_per_uid(tmp_path, tok):
    assert _agent_loop_registry["memrl"]["_target_"].endswith("verl_agent_loop.MemrlAgentLoop")
    inputs, rows = _rows_through_verl_dataset(tmp_path, tok)
    assert rows[0]["agent_name"] == "memrl" and "raw_prompt" in rows[0]
    server = PolicyServerClient(ScriptedPolicy(tok, rollback_script))
    config = _verl_config()
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": False}

    async def step():
        # verl: rows repeated n times (interleaved), one uid per prompt, one agent loop per sample
        samples = [(f"uid-{i}", row) for i, row in enumerate(rows) for _ in range(N)]
        tasks = [_agent(config, server, tok).run(dict(sampling), uid=uid, **row) for uid, row in samples]
        return await asyncio.gather(*tasks)

    try:
        outs = asyncio.run(step())
    finally:
        shutdown_services()
    assert len(outs) == len(rows) * N and all(isinstance(o, AgentLoopOutput) for o in outs)
    # memrl's own runner on the same episodes with the same script: the same sequences, masks and rewards
    runner = build_runner(
        load_config(None, [*OVERRIDES, f"rollout.n={N}"]), policy=ScriptedPolicy(tok, rollback_script)
    )
    try:
        own = runner.run_batch(inputs)
    finally:
        runner.tools.close()
    for out, traj in zip(outs, own, strict=True):
        step = traj.steps[-1]
        assert out.prompt_ids == list(step.prompt_ids)
        assert out.response_ids == list(step.response_ids) and out.response_mask == list(step.response_mask)
        assert out.reward_score == traj.reward
        assert 0 in out.response_mask  # the tool result is not trained on
        meta = out.extra_fields["memrl_step_meta"]
        assert len(meta["rollbacks"]) == 1 and meta["tool_calls"][0]["status"] == "ok"
    assert {o.extra_fields["memrl_episode_id"].split("@")[1].split("#")[0] for o in outs} == {
        "uid-0",
        "uid-1",
    }
    # one batched episode per step: both uids' memory ingested in one runner call, leaves of a uid distinct
    assert len({o.extra_fields["memrl_episode_id"] for o in outs}) == len(outs)
    as_dict = outs[0].as_dict()  # verl's own conversion to tensors (rm_scores on the last token)
    assert as_dict["rm_scores"][-1] == outs[0].reward_score


def test_a_uid_split_across_workers_gives_one_episode_per_share(tmp_path, tok, caplog):
    """verl's legacy trainer cuts 3 prompts x 2 samples into 2 workers' contiguous chunks of 3: the middle
    prompt's samples land on both. Each share is its own episode of that size, with distinct ids."""
    overrides = [o for o in OVERRIDES if not o.startswith("data.options")] + [
        "data.options={num_episodes: 3}"
    ]
    inputs, rows = _rows_through_verl_dataset(tmp_path, tok, overrides)
    samples = [
        (f"uid-{i}", row) for i, row in enumerate(rows) for _ in range(N)
    ]  # interleaved, as verl repeats
    config = _verl_config(overrides)
    config.data.train_batch_size = len(rows)
    config.actor_rollout_ref.rollout.agent = {"num_workers": 2}
    sampling = {"temperature": 1.0, "top_p": 1.0}

    async def worker(chunk, start):
        server = PolicyServerClient(
            ScriptedPolicy(tok, rollback_script)
        )  # each worker has its own server client
        tasks = [
            _agent(config, server, tok).run(dict(sampling), uid=uid, priority=start + k, **row)
            for k, (uid, row) in enumerate(chunk)
        ]
        return await asyncio.gather(*tasks)

    half = len(samples) // 2
    try:
        with caplog.at_level("WARNING", logger="memrl.integrations.verl_agent_loop"):
            outs = asyncio.run(worker(samples[:half], 0)) + asyncio.run(worker(samples[half:], half))
    finally:
        shutdown_services()
    assert "not a multiple of actor_rollout_ref.rollout.agent.num_workers=2" in caplog.text
    sizes = [o.extra_fields["memrl_group_size"] for o in outs]
    assert sizes == [2, 2, 1, 1, 2, 2]  # uid-1: one sample on each worker, each its own 1-leaf episode
    ids = [o.extra_fields["memrl_episode_id"] for o in outs]
    assert len(set(ids)) == len(ids)
    assert ids[2].split("#")[0].endswith("@uid-1:2") and ids[3].split("#")[0].endswith("@uid-1:3")
    # each share ran the whole episode: the same leaf memrl's own runner gives that episode with n=1
    runner = build_runner(
        load_config(None, [*overrides, "rollout.n=1"]), policy=ScriptedPolicy(tok, rollback_script)
    )
    try:
        [own] = runner.run_batch([inputs[1]])
    finally:
        runner.tools.close()
    for out in outs[2:4]:
        assert out.response_ids == list(own.steps[-1].response_ids) and out.reward_score == own.reward
    # a batch that divides evenly, or the v1 trainer (which never splits a prompt), raises no warning
    caplog.clear()
    config.data.train_batch_size = 4
    check_worker_split(config)
    config.data.train_batch_size = 3
    config.trainer = {"use_v1": True}
    check_worker_split(config)
    assert not caplog.text


def test_lengths_that_cannot_fit_verl_fail_at_start(tmp_path, tok):
    _, rows = _rows_through_verl_dataset(tmp_path, tok)
    server = PolicyServerClient(ScriptedPolicy(tok, rollback_script))
    sampling = {"temperature": 1.0}
    try:
        with pytest.raises(VerlConfigError, match="response_length"):
            asyncio.run(
                _agent(_verl_config(response_length=64), server, tok).run(sampling, uid="u", **rows[0])
            )
        with pytest.raises(VerlConfigError, match="prompt_length"):
            asyncio.run(_agent(_verl_config(prompt_length=8), server, tok).run(sampling, uid="u", **rows[0]))
    finally:
        shutdown_services()
    assert MemrlAgentLoop.__name__ == "MemrlAgentLoop"


WRITER = [
    "data.adapter=synthetic",
    "data.options={num_episodes: 2}",
    "tools.enabled=[]",
    "rollout.max_response_tokens=48",
    "memory.extractor=policy",
    "memory.write_max_tokens=200",
    "memory.neighbour_turns=0",
    "episode.record_history_turns=false",
    "episode.ingest_chunk_turns=6",
    "episode.reward=char_similarity",
    "episode.memory_credit.name=used",
    "train.role_adapters=shared",
]


def _writer_config(overrides=WRITER, **verl):
    config = _verl_config(overrides=overrides)
    config.trainer = {"use_v1": verl.get("use_v1", True)}
    config.algorithm = {"adv_estimator": verl.get("estimator", "memrl_step_credit")}
    lib = verl.get("external_lib", "memrl.integrations.verl_credit")
    config.actor_rollout_ref.model = {"external_lib": lib}
    return config


@pytest.mark.parametrize(
    ("overrides", "verl", "message"),
    [
        ([*WRITER, "train.role_adapters=per_role"], {}, "train.role_adapters=shared"),
        ([*WRITER, "memory.write_max_tokens=400"], {}, "memory.write_max_tokens=400 exceeds"),
        (WRITER, {"use_v1": False}, "set trainer.use_v1=true"),
        (WRITER, {"estimator": "grpo"}, "set algorithm.adv_estimator=memrl_step_credit"),
        (WRITER, {"external_lib": None}, "external_lib=memrl.integrations.verl_credit"),
        (
            [
                *WRITER,
                "episode.memory_credit.name=snapshot",
                "episode.memory_credit.snapshot_score=gold_logprob",
            ],
            {},
            "snapshot_score=answer",
        ),
    ],
)
def test_policy_writer_settings_verl_cannot_train_fail_at_start(tmp_path, tok, overrides, verl, message):
    _, rows = _rows_through_verl_dataset(tmp_path, tok, WRITER)
    server = PolicyServerClient(ScriptedPolicy(tok, memory_script))
    try:
        with pytest.raises(VerlConfigError, match=re.escape(message)):
            asyncio.run(
                _agent(_writer_config(overrides, **verl), server, tok).run(
                    {"temperature": 1.0}, uid="u", **rows[0]
                )
            )
    finally:
        shutdown_services()


class _OnePerCall:
    """The scripted policy as verl's servers serve it: a request for n samples is n requests of one."""

    def __init__(self, policy):
        self.policy, self.tokenizer = policy, policy.tokenizer

    def generate(self, requests):
        one = [dataclasses.replace(r, params=dataclasses.replace(r.params, n=1)) for r in requests]
        return [
            [self.policy.generate([r])[0][0] for _ in range(req.params.n)]
            for r, req in zip(one, requests, strict=True)
        ]


def test_policy_written_memory_returns_the_credited_writes_then_the_answer(tmp_path, tok, monkeypatch):
    """With memory.extractor=policy each sample returns a list of verl outputs: the sample that holds leaf 0 its
    episode's credited writes (generated through verl's server) and its answer, the others their answer."""
    from memrl.integrations.verl_policy import VerlServerPolicy

    batches: list[int] = []  # requests per generate call of memory writes
    generate = VerlServerPolicy.generate

    def counted(self, requests):
        if "Operations:" in tok.decode(list(requests[0].prompt_ids)):
            batches.append(len(requests))
        return generate(self, requests)

    monkeypatch.setattr(VerlServerPolicy, "generate", counted)
    inputs, rows = _rows_through_verl_dataset(tmp_path, tok, WRITER)
    server = PolicyServerClient(ScriptedPolicy(tok, memory_script))
    config = _writer_config()
    config.memrl.rollout_dir = str(tmp_path / "rollouts")

    async def step():
        samples = [(f"uid-{i}", row) for i, row in enumerate(rows) for _ in range(N)]
        tasks = [
            _agent(config, server, tok).run({"temperature": 1.0}, uid=uid, global_steps=1, **row)
            for uid, row in samples
        ]
        return await asyncio.gather(*tasks)

    try:
        outs = asyncio.run(step())
    finally:
        shutdown_services()
    assert all(isinstance(o, list) for o in outs)
    roles = [[x.extra_fields["memrl_role"] for x in o] for o in outs]
    # per uid: one sample with writes then its answer, one with its answer only
    for i in range(len(rows)):
        a, b = roles[i * N : (i + 1) * N]
        assert a[-1] == b[-1] == "answer" and sorted([len(a), len(b)])[0] == 1
        assert set((a if len(a) > 1 else b)[:-1]) == {"memory"}
    write_prompts = [p for p, _ in server.calls if "Operations:" in tok.decode(p)]
    assert len(write_prompts) == 3 * len(rows)  # 18 turns in writes of 6, sampled once (used credit)
    assert batches == [len(rows)] * 3  # each write round: one call for both prompts' episodes
    # memrl's own runner on the same episodes and script: the same writes, credits and groups
    runner = build_runner(
        load_config(None, [*WRITER, f"rollout.n={N}"]), policy=_OnePerCall(ScriptedPolicy(tok, memory_script))
    )
    own = [ep for ep in runner.run_batch(inputs) if ep.episode_id.endswith("#0")]
    for o, ep in zip([o for o in outs if len(o) > 1], own, strict=True):
        writes = [(s, r) for s, r in zip(ep.steps, ep.step_rewards_ext, strict=True) if r is not None]
        assert [x.prompt_ids for x in o[:-1]] == [list(s.prompt_ids) for s, _ in writes]
        assert [x.response_ids for x in o[:-1]] == [list(s.response_ids) for s, _ in writes]
        assert [x.reward_score for x in o[:-1]] == pytest.approx([r for _, r in writes])
        groups = {x.extra_fields["memrl_credit_group"] for x in o[:-1]}
        assert groups == {f"{o[-1].extra_fields['memrl_credit_group']}/memory"}
    # +memrl.rollout_dir: memrl inspect shows the writes of verl's episodes as memrl train's
    from memrl.inspect import load_run
    from memrl.inspect.terminal import writes_table

    (run_dir,) = (tmp_path / "rollouts").iterdir()
    run = load_run(run_dir)
    for o in (o for o in outs if len(o) > 1):
        view = run.episode(o[-1].extra_fields["memrl_episode_id"])
        assert [w.credit for w in view.writes] == pytest.approx([x.reward_score for x in o[:-1]])
        assert all(w.read_turns and w.ops for w in view.writes) and writes_table(view).row_count == 3
    assert {e["metrics"]["verl/global_step"] for e in run.episodes_meta} == {1.0}


def test_one_role_or_the_other(tmp_path, tok):
    """train.roles=[answer]: greedy writes, one output (the answer) per sample; [memory]: writes only."""
    _, rows = _rows_through_verl_dataset(tmp_path, tok, WRITER)
    server = PolicyServerClient(ScriptedPolicy(tok, memory_script))
    try:
        answer = asyncio.run(
            _agent(_writer_config([*WRITER, "train.roles=[answer]"]), server, tok).run(
                {"temperature": 1.0}, uid="u", **rows[0]
            )
        )
        shutdown_services()
        memory = asyncio.run(
            _agent(_writer_config([*WRITER, "train.roles=[memory]"]), server, tok).run(
                {"temperature": 1.0}, uid="v", **rows[0]
            )
        )
    finally:
        shutdown_services()
    assert isinstance(answer, AgentLoopOutput) and answer.extra_fields["memrl_role"] == "answer"
    assert memory and {o.extra_fields["memrl_role"] for o in memory} == {"memory"}
    # the untrained writer writes greedily: its requests reached verl's server with temperature 0
    assert any(p["temperature"] == 0 for _, p in server.calls)


def test_alternating_roles_follow_verls_global_step(tmp_path, tok):
    """train.role_schedule=alternate: the step verl passes (global_steps) picks the role whose rows return."""
    _, rows = _rows_through_verl_dataset(tmp_path, tok, WRITER)
    server = PolicyServerClient(ScriptedPolicy(tok, memory_script))
    overrides = [*WRITER, "train.role_schedule=alternate", "train.role_phase_steps=1"]
    config = _writer_config(overrides)
    got = {}
    try:
        for step in (1, 2):
            outs = asyncio.run(
                _agent(config, server, tok).run(
                    {"temperature": 1.0}, uid=f"u{step}", global_steps=step, **rows[0]
                )
            )
            got[step] = {o.extra_fields["memrl_role"] for o in outs}
    finally:
        shutdown_services()
    assert got == {1: {"answer"}, 2: {"memory"}}
