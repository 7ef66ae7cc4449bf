"""memrl as a verl agent loop: :class:`MemrlAgentLoop`, registered with verl as ``memrl``.

verl's ``AgentLoopWorker`` runs one agent loop per sample (``rollout.n`` samples per prompt, one ``uid`` per
prompt) and awaits ``run(sampling_params, **row)``. :class:`MemrlAgentLoop` reads the sample's episode from
``row["extra_info"]`` (:func:`memrl.integrations.verl.verl_dataset_rows`) and hands it to the worker's
:class:`EpisodeService`, which gathers the samples that arrive together and runs them as *one* memrl batch:
samples of one ``uid`` become the ``n`` leaves of one episode (memory ingested once; with
``rollout.strategy=tree`` they are one tree), every phase is one batched call, and generation goes through
verl's servers (:class:`~memrl.integrations.verl_policy.VerlServerPolicy`). Each sample gets one leaf back as
verl's ``AgentLoopOutput``: the target turn's prompt ids, response ids (model tokens and tool results),
``response_mask`` (0 on tool results and feedback), the behaviour log-probs, the episode reward as
``reward_score``, and memrl's step metadata in ``extra_fields`` (``memrl_step_meta``, never in the loss).

With ``memory.extractor: policy`` and the writer trained (``memory`` in ``train.roles``) a sample gets a list
instead: its leaf's credited memory writes, each a row with its own reward and memrl group, then its answer
(:mod:`memrl.integrations.verl_rows`); verl's v1 trainer makes each a row, and ``algorithm.adv_estimator=
memrl_step_credit`` (:mod:`memrl.integrations.verl_credit`) trains them with memrl's step credit.

Configuration lives in verl's config under ``memrl`` (``+memrl.config=<memrl yaml>``,
``+memrl.overrides=[key=value,...]``); the recipe is in ``docs/verl.md``. Importing this module needs verl.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from memrl.integrations.verl import INSTALL_HINT, episode_input, select_leaves, target_step
from memrl.integrations.verl_policy import VerlServerPolicy
from memrl.integrations.verl_rows import (
    ANSWER,
    ESTIMATOR,
    VerlRow,
    credit_module_loaded,
    leaf_rows,
    row_fields,
)
from memrl.integrations.verl_rows import (
    CREDIT_MODULE as MODULE,
)
from memrl.serialize import to_dict
from memrl.train.roles import active_roles
from memrl.types import BatchInput, EpisodeTrajectory

try:
    from verl.experimental.agent_loop.agent_loop import (
        AgentLoopBase,
        AgentLoopMetrics,
        AgentLoopOutput,
        register,
    )
except ImportError as exc:  # pragma: no cover - exercised only where verl is missing
    raise ImportError(f"{INSTALL_HINT} (import failed: {exc})") from exc

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from memrl.config import Config
    from memrl.rollout.config import RolloutConfig

logger = logging.getLogger(__name__)


class VerlConfigError(ValueError):
    """memrl's config and verl's config disagree in a way that would break verl's batch; says which keys."""


def memrl_config(verl_config: DictConfig) -> Config:
    """memrl's root config from verl's ``memrl`` section (``config``: YAML path, ``overrides``: list)."""
    from memrl.config import load_config

    section = verl_config.get("memrl", None) or {}
    return load_config(section.get("config", None), list(section.get("overrides", None) or ()))


def check_lengths(rollout: RolloutConfig, rollout_config: DictConfig) -> None:
    """Fail at start-up when memrl's episodes (``rollout``) cannot fit verl's fixed prompt/response widths
    (``rollout_config``: verl's ``actor_rollout_ref.rollout``)."""
    if rollout.max_response_tokens > rollout_config.response_length:
        raise VerlConfigError(
            f"memrl rollout.max_response_tokens={rollout.max_response_tokens} exceeds verl's "
            f"actor_rollout_ref.rollout.response_length={rollout_config.response_length}: lower the first "
            "(+memrl.overrides=[rollout.max_response_tokens=...]) or raise data.max_response_length"
        )


def policy_writes(cfg: Config) -> bool:
    """``memory.extractor: policy``: the policy writes the memory, each write a trainable step."""
    from memrl.memory.extractors import writes_steps

    return writes_steps(cfg.memory.extractor)


def check_memory_writer(cfg: Config, verl_config: DictConfig) -> None:
    """What a policy-written memory (``memory.extractor: policy``) needs from verl's config, checked at start-up.

    Its writes are rows of their own (:mod:`memrl.integrations.verl_rows`): only verl's v1 trainer takes several
    outputs from one sample, and only memrl's estimator trains them on their own rewards and groups
    (:mod:`memrl.integrations.verl_credit`). verl trains one actor model, so both roles share its weights."""
    if not policy_writes(cfg):
        return
    if cfg.train.role_adapters != "shared":
        raise VerlConfigError(
            f"memrl train.role_adapters={cfg.train.role_adapters}: verl trains one actor model (one LoRA or the full "
            "weights), so the writer cannot have an adapter of its own there; set "
            "+memrl.overrides=[train.role_adapters=shared] (both roles on verl's actor), or train per-role "
            "adapters with `memrl train`"
        )
    if cfg.episode.memory_credit.name == "snapshot" and cfg.episode.memory_credit.snapshot_score != "answer":
        raise VerlConfigError(
            f"memrl episode.memory_credit.snapshot_score={cfg.episode.memory_credit.snapshot_score}: it scores "
            "the gold answer's likelihood over each fork's prompt, and verl's servers return the log-probs of "
            "sampled tokens only; set +memrl.overrides=[episode.memory_credit.snapshot_score=answer] (each fork "
            "answers greedily through verl's servers)"
        )
    width = verl_config.actor_rollout_ref.rollout.response_length
    if cfg.memory.write_max_tokens > width:
        raise VerlConfigError(
            f"memrl memory.write_max_tokens={cfg.memory.write_max_tokens} exceeds verl's "
            f"actor_rollout_ref.rollout.response_length={width}: a write is a row of verl's batch; lower the first "
            "or raise data.max_response_length"
        )
    if "memory" not in cfg.train.roles:
        return  # greedy writes, answer rows only: one output per sample, any trainer and estimator
    trainer = verl_config.get("trainer", None) or {}
    if not trainer.get("use_v1", False):
        raise VerlConfigError(
            "memrl memory.extractor=policy with train.roles including memory: each credited write is a row of its "
            "own, and only verl's v1 trainer takes several outputs per sample; set trainer.use_v1=true, or "
            "+memrl.overrides=[train.roles=[answer]] to train the answer over the policy's greedy writes"
        )
    estimator = (verl_config.get("algorithm", None) or {}).get("adv_estimator", None)
    if estimator != ESTIMATOR:
        raise VerlConfigError(
            f"memrl memory.extractor=policy trains its writes on their own rewards and groups, but "
            f"algorithm.adv_estimator={estimator}: verl's GRPO would give every write its sample's answer "
            f"advantage; set algorithm.adv_estimator={ESTIMATOR} actor_rollout_ref.model.external_lib={MODULE}"
        )
    if not credit_module_loaded(verl_config):
        raise VerlConfigError(
            f"algorithm.adv_estimator={ESTIMATOR} lives in {MODULE}, which verl's trainer must import: set "
            f"actor_rollout_ref.model.external_lib={MODULE} (or VERL_USE_EXTERNAL_MODULES={MODULE})"
        )
    import memrl.integrations.verl_credit  # noqa: F401  (checks the verl lines it relies on, here too)


def check_worker_split(verl_config: DictConfig) -> None:
    """Warn at start-up when verl's legacy trainer will split some ``uid``'s samples across agent-loop workers.

    ``AgentLoopManager.generate_sequences`` (``trainer.use_v1=false``) cuts the step's ``batch × n`` samples,
    each prompt's ``n`` contiguous, into ``num_workers`` equal contiguous chunks, so a prompt straddles two
    workers unless ``train_batch_size`` is a multiple of ``num_workers``. Each worker's share still runs as one
    episode of that many leaves (see :class:`EpisodeService`); the v1 trainer never splits (each worker spawns
    the ``n`` samples of its own prompts)."""
    trainer, data = verl_config.get("trainer", None) or {}, verl_config.get("data", None) or {}
    batch = data.get("train_batch_size", None)
    workers = verl_config.actor_rollout_ref.rollout.get("agent", {}).get("num_workers", None)
    if trainer.get("use_v1", False) or not batch or not workers or batch % workers == 0:
        return
    logger.warning(
        "data.train_batch_size=%d is not a multiple of actor_rollout_ref.rollout.agent.num_workers=%d: verl "
        "splits some prompts' samples across agent-loop workers, and each worker's share becomes its own memrl "
        "episode (its own tree, memory ingested once per share; extra field memrl_group_size). For one episode "
        "per prompt, make train_batch_size a multiple of num_workers.",
        batch,
        workers,
    )


@dataclasses.dataclass
class _Pending:
    inp: BatchInput
    uid: str
    sampling: dict[str, Any]
    future: asyncio.Future
    position: int | None = None  # verl's global sample position in the step (``priority``), where given
    global_step: int | None = None  # verl's training step (``global_steps``), where given


@dataclasses.dataclass(frozen=True)
class _Leaf:
    """What one verl sample gets back: its leaf, the timings of the batch it ran in, the number of samples of
    its ``uid`` on this worker (the leaves of its episode), and the oldest and newest actor weight version its
    batch generated under (verl's ``min_global_steps`` / ``max_global_steps``; bounds for every leaf in it)."""

    traj: EpisodeTrajectory
    timing: dict[str, float]
    group_size: int
    weight_versions: tuple[int | None, int | None] = (None, None)


class EpisodeService:
    """One per agent-loop worker: a memrl :class:`~memrl.episode.runner.EpisodeRunner` whose policy is verl's
    server client, fed in batches. memrl code runs on one worker thread (never two batches at once); the
    worker's event loop stays free to serve the generate calls and the other samples.

    The samples of one ``uid`` that this worker holds become the leaves of one episode. When verl's legacy
    trainer splits a ``uid``'s samples across workers (:func:`check_worker_split`), each worker's share is its
    own episode of that size (its own tree under ``rollout.strategy=tree``), with an id that names the share's
    first sample position, so leaf ids stay unique across workers; GRPO still groups all of them by ``uid``."""

    def __init__(self, cfg: Config, policy: VerlServerPolicy, rollout_dir: str | None = None) -> None:
        from memrl.episode.build import build_runner

        self.cfg = cfg
        self.policy = policy
        # As `memrl train`: writes are sampled (and credited alternatives drawn) only where the writer trains.
        self.writes_rows = policy_writes(cfg)
        self.runner = build_runner(cfg, policy=policy, sample_writes="memory" in cfg.train.roles)
        self.dump = _worker_dump(rollout_dir)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="memrl-episodes")
        self._pending: list[_Pending] = []
        self._lock = asyncio.Lock()
        self._draining = False

    async def submit(
        self,
        inp: BatchInput,
        uid: str,
        sampling: Mapping[str, Any],
        position: int | None = None,
        global_step: int | None = None,
    ) -> _Leaf:
        """The leaf for one verl sample (``position``: its global position in the step, if verl gives one)."""
        loop = asyncio.get_running_loop()
        item = _Pending(inp, uid, dict(sampling), loop.create_future(), position, global_step)
        self._pending.append(item)
        if not self._draining:
            self._draining = True
            loop.create_task(self._drain())
        return await item.future

    async def _drain(self) -> None:
        # Yield once so the samples verl started in the same gather all enqueue before the batch is cut.
        await asyncio.sleep(0)
        async with self._lock:
            self._draining = False
            items, self._pending = self._pending, []
            if not items:
                return
            loop = asyncio.get_running_loop()
            try:
                results = await loop.run_in_executor(self._executor, self._run, items)
            except BaseException as exc:  # infrastructure: every waiting sample sees the error
                for it in items:
                    if not it.future.done():
                        it.future.set_exception(exc)
                return
            for it, result in zip(items, results, strict=True):
                it.future.set_result(result)

    def _run(self, items: list[_Pending]) -> list[_Leaf]:
        """Runs on the memrl thread: per sampling setting, per group size, one ``run_batch``."""
        out: dict[int, _Leaf] = {}
        by_sampling: dict[tuple, list[int]] = {}
        for i, it in enumerate(items):
            by_sampling.setdefault(tuple(sorted(it.sampling.items())), []).append(i)
        for idx in by_sampling.values():
            self.policy.set_sampling(items[idx[0]].sampling)
            groups: dict[str, list[int]] = {}
            for i in idx:
                groups.setdefault(items[i].uid, []).append(i)
            by_size: dict[int, list[list[int]]] = {}
            for members in groups.values():
                by_size.setdefault(len(members), []).append(members)
            for n, uid_groups in by_size.items():
                self._run_groups(items, uid_groups, n, out)
        return [out[i] for i in range(len(items))]

    def _run_groups(self, items, uid_groups: list[list[int]], n: int, out: dict) -> None:
        runner = self.runner
        base = runner.rollout_cfg
        before = dict(runner.metrics)
        inputs = [
            dataclasses.replace(
                items[m[0]].inp, episode_id=_share_id([items[i] for i in m]), group_id=items[m[0]].uid
            )
            for m in uid_groups
        ]
        runner.rollout_cfg = dataclasses.replace(base, n=n)
        self.policy.take_weight_versions()  # start counting at this batch
        try:
            trajs = runner.run_batch(inputs)
        finally:
            runner.rollout_cfg = base
        versions = self.policy.take_weight_versions()
        timing = {
            "generate_sequences": runner.metrics["episode/time_generate_s"]
            - before.get("episode/time_generate_s", 0),
            "tool_calls": runner.metrics["episode/time_tools_s"] - before.get("episode/time_tools_s", 0),
        }
        timing["generate_sequences"] -= timing["tool_calls"]  # tools run inside the generation phase
        dumped = []
        for inp, members in zip(inputs, uid_groups, strict=True):
            mine = [t for t in trajs if t.group_id == inp.group_id]
            for i, leaf in zip(members, select_leaves(inp, mine, n), strict=True):
                out[i] = _Leaf(leaf, timing, n, versions)
                step = items[i].global_step
                dumped.append(leaf if step is None else _with_step(leaf, step))
        if self.dump is not None:
            self.dump.write(dumped)


def _worker_dump(rollout_dir: str | None):
    """``+memrl.rollout_dir``: every leaf this worker runs, in a ``memrl run`` output directory of its own
    (``<rollout_dir>/worker-<host>-<pid>``), so ``memrl inspect`` shows verl's episodes as it shows memrl's: the
    memory writes with what they read, their operations, the store after them and their credit."""
    if not rollout_dir:
        return None
    import os
    import socket
    from pathlib import Path

    from memrl.episode.output import TrajectoryWriter

    return TrajectoryWriter(Path(rollout_dir) / f"worker-{socket.gethostname()}-{os.getpid()}")


def _with_step(leaf: EpisodeTrajectory, step: int) -> EpisodeTrajectory:
    return dataclasses.replace(leaf, metrics={**leaf.metrics, "verl/global_step": float(step)})


def _share_id(share: list[_Pending]) -> str:
    """``<episode>@<uid>``, plus ``:<first sample position>`` where verl numbers its samples: a ``uid`` split
    across workers gives one episode per share, and their leaf ids must not collide."""
    first = share[0]
    positions = [it.position for it in share if it.position is not None]
    tail = f":{min(positions)}" if positions else ""
    return f"{first.inp.episode_id}@{first.uid}{tail}"


# Services are per worker process and event loop: verl instantiates one agent loop per sample.
_SERVICES: dict[tuple[int, int], EpisodeService] = {}


def service_for(agent: AgentLoopBase) -> EpisodeService:
    loop = asyncio.get_running_loop()
    key = (id(loop), id(agent.server_manager))
    service = _SERVICES.get(key)
    if service is None:
        cfg = memrl_config(agent.config)
        check_lengths(cfg.rollout, agent.rollout_config)
        check_memory_writer(cfg, agent.config)
        check_worker_split(agent.config)
        rc = agent.rollout_config
        policy = VerlServerPolicy(
            agent.server_manager, agent.tokenizer, loop, max_model_len=rc.prompt_length + rc.response_length
        )
        section = agent.config.get("memrl", None) or {}
        service = _SERVICES[key] = EpisodeService(cfg, policy, section.get("rollout_dir", None))
    return service


@register("memrl")
class MemrlAgentLoop(AgentLoopBase):
    """verl agent loop that runs a memrl episode per sample (see the module docstring)."""

    def __init__(self, *args: Any, tools: Any = None, **kwargs: Any) -> None:
        # verl passes its own tool list; memrl's tools come from memrl's config (sandbox, rollback).
        super().__init__(*args, **kwargs)

    async def run(
        self, sampling_params: dict[str, Any], **kwargs: Any
    ) -> AgentLoopOutput | list[AgentLoopOutput]:
        """The sample's leaf as verl outputs: one (the answer), or with ``memory.extractor: policy`` the leaf's
        credited memory writes followed by the answer, each a row of verl's batch (the v1 trainer)."""
        uid = str(kwargs.get("uid", kwargs.get("index", "0")))
        inp = episode_input(kwargs.get("extra_info"), sample=f"uid={uid}")
        position = kwargs.get("priority")  # verl >= 0.9: the sample's global position in the step
        service = service_for(self)
        step = kwargs.get("global_steps")  # the v1 trainer's step (role_schedule=alternate, dumps)
        got = await service.submit(
            inp,
            uid,
            sampling_params,
            None if position is None else int(position),
            None if step is None else int(step),
        )
        if not service.writes_rows or "memory" not in service.cfg.train.roles:
            return self.output(got)
        roles = (
            active_roles(service.cfg.train, max(1, int(step)))
            if step is not None
            else service.cfg.train.roles
        )
        target_step(got.traj)  # validates the leaf: one target step
        rows = leaf_rows(got.traj, roles)
        return [self.row_output(got, row) for row in rows]

    def output(self, got: _Leaf) -> AgentLoopOutput:
        """verl's output for one leaf: the target step, with the episode reward on its last token."""
        target_step(got.traj)
        (row,) = leaf_rows(got.traj, (ANSWER,))
        return self.row_output(got, row)

    def row_output(self, got: _Leaf, vrow: VerlRow) -> AgentLoopOutput:
        """verl's output for one row of a leaf (an answer, or a credited memory write): its reward on its last
        token, and in ``extra_fields`` what memrl's estimator reads (:func:`memrl.integrations.verl_rows.row_fields`)."""
        leaf, row = got.traj, vrow.row
        prompt_length = self.rollout_config.prompt_length
        if len(row.prompt_ids) > prompt_length:
            what = "prompt" if vrow.role == ANSWER else "memory-write prompt"
            raise VerlConfigError(
                f"memrl's {what} for {leaf.episode_id} ({row.step_id}) has {len(row.prompt_ids)} tokens, over "
                f"verl's actor_rollout_ref.rollout.prompt_length={prompt_length}: lower episode.prompt_token_budget "
                "(or memory.write_neighbours / episode.ingest_chunk_turns for writes) or raise data.max_prompt_length"
            )
        width = self.rollout_config.response_length
        answer = vrow.role == ANSWER
        extra = {
            "turn_scores": [],
            "tool_rewards": [],
            # verl's _agent_loop_postprocess copies the last output's entry onto a sample's earlier outputs
            "reward_extra_info": {},
            "memrl_step_meta": to_dict(row.meta),
            "memrl_step_id": row.step_id,
            "memrl_episode_id": leaf.episode_id,
            "memrl_status": leaf.status.value,
            "memrl_group_size": got.group_size,
            **row_fields(vrow),
            # verl's staleness bookkeeping (the v1 trainer reads both into its tags)
            "min_global_steps": got.weight_versions[0],
            "max_global_steps": got.weight_versions[1],
        }
        return AgentLoopOutput(
            prompt_ids=list(row.prompt_ids),
            response_ids=list(row.response_ids[:width]),
            response_mask=list(row.response_mask[:width]),
            response_logprobs=[float(x) for x in row.logprobs[:width]],
            reward_score=float(row.reward),
            num_turns=2 + 2 * len(row.meta.tool_calls) if answer else 2,
            metrics=AgentLoopMetrics(**got.timing) if answer else AgentLoopMetrics(),
            extra_fields=extra,
        )


def shutdown_services() -> None:
    """Stop the memrl threads of this process (tests; verl's workers end with their process)."""
    for service in _SERVICES.values():
        service._executor.shutdown(wait=True)
    _SERVICES.clear()


__all__ = [
    "EpisodeService",
    "MemrlAgentLoop",
    "VerlConfigError",
    "check_worker_split",
    "memrl_config",
    "policy_writes",
    "shutdown_services",
]
