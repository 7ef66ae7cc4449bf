"""verl hook: memrl's episode pipeline as the rollout of verl's ``RayPPOTrainer.fit``.

:class:`MemrlRollout` has verl's rollout interface, ``generate_sequences(DataProto) -> DataProto``. Inside
``fit`` verl builds the generation batch (one row per prompt, ``repeat(n, interleave=True)``, a ``uid`` per prompt)
and calls the rollout; we run one memrl episode per ``uid`` (memory ingest of the history turns → prompt with
retrieved facts → chain or tree rollout producing exactly as many leaves as that uid has rows → reward) and
return a padded ``DataProto`` whose rows line up with the input rows, with the fields verl's trainer reads:
``prompts``, ``responses``, ``response_mask``, ``input_ids``, ``attention_mask``, ``position_ids``,
``rollout_log_probs``, token-level scores (``rm_scores`` / ``token_level_scores``: the episode reward on the
last trained token), and ``uid`` (verl's GRPO grouping key; all leaves of one tree share it). ``step_meta``
(tree path, tool calls, rollbacks, memory ops) travels as a non-tensor sidecar and never enters the loss.
Field names and layout come from :func:`memrl.data.dataproto.to_dataproto`.

Each input row names its memrl episode: ``non_tensor_batch["memrl_input"][i]`` or
``non_tensor_batch["extra_info"][i]["memrl_input"]`` holds a :class:`~memrl.types.BatchInput` or its dict form
(:func:`memrl.types.to_dict`). :func:`verl_dataset_rows` writes such rows for verl's ``RLHFDataset``.

Recipe (verl ≥ 0.5; ``pip install 'memrl[verl]'``)::

    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from memrl.config import load_config
    from memrl.integrations.verl import MemrlRollout, verl_dataset_rows

    cfg = load_config("configs/synthetic_tree.yaml")
    pd.DataFrame(verl_dataset_rows(train_inputs)).to_parquet("train.parquet")   # data.train_files
    trainer = RayPPOTrainer(config=verl_cfg, ...)        # algorithm.adv_estimator=grpo, rollout.n = cfg.rollout.n
    trainer.init_workers()
    rollout = MemrlRollout.from_config(cfg)              # policy backend: vLLM with LoRA requests, or HF
    trainer.async_rollout_manager = rollout              # verl 0.6+: fit calls async_rollout_manager.generate_sequences
    # older verl: trainer.actor_rollout_wg.generate_sequences = rollout.generate_sequences
    trainer.fit()

After each actor update verl syncs weights to its own rollout engine; when memrl generates, point the memrl
policy at the new adapter (``rollout.policy.load_adapter(path)`` after verl saves it, or share the HF module).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from memrl.types import (
    BatchInput,
    EpisodeStatus,
    EpisodeTrajectory,
    StepMeta,
    StepTrajectory,
    TurnRole,
    batch_input_from_dict,
    to_dict,
)

logger = logging.getLogger(__name__)

INPUT_KEY = "memrl_input"


class VerlHookError(ValueError):
    """A verl batch cannot be mapped to memrl episodes; the message names the row and the key."""


def verl_dataset_rows(inputs: Sequence[BatchInput], data_source: str = "memrl") -> list[dict[str, Any]]:
    """Rows for verl's ``RLHFDataset`` parquet: a chat prompt (the question; memrl builds the real prompt with
    memory itself), the gold answer for verl's reward bookkeeping, and the whole episode in ``extra_info``."""
    return [
        {
            "data_source": data_source,
            "prompt": [{"role": "user", "content": inp.final_query}],
            "reward_model": {"style": "rule", "ground_truth": inp.target_answer or ""},
            "extra_info": {INPUT_KEY: to_dict(inp), "index": i},
        }
        for i, inp in enumerate(inputs)
    ]


def _row_input(non_tensor: Mapping[str, Any], i: int) -> BatchInput:
    raw = None
    if INPUT_KEY in non_tensor:
        raw = non_tensor[INPUT_KEY][i]
    elif "extra_info" in non_tensor and isinstance(non_tensor["extra_info"][i], Mapping):
        raw = non_tensor["extra_info"][i].get(INPUT_KEY)
    if raw is None:
        raise VerlHookError(
            f"verl batch row {i}: no memrl episode; put a BatchInput (or its dict) in "
            f"non_tensor_batch[{INPUT_KEY!r}] or extra_info[{INPUT_KEY!r}] (see verl_dataset_rows)"
        )
    return raw if isinstance(raw, BatchInput) else batch_input_from_dict(raw)


def group_rows(prompts: Any) -> list[tuple[str, list[int], BatchInput]]:
    """``(uid, row indices, episode input)`` per uid, in order of first appearance."""
    nt = prompts.non_tensor_batch
    if "uid" not in nt:
        raise VerlHookError(
            "verl batch has no non_tensor_batch['uid'] (RayPPOTrainer.fit sets it per prompt)"
        )
    groups: dict[str, tuple[list[int], BatchInput]] = {}
    for i, uid in enumerate(nt["uid"]):
        uid = str(uid)
        if uid not in groups:
            groups[uid] = ([], _row_input(nt, i))
        groups[uid][0].append(i)
    return [(uid, rows, inp) for uid, (rows, inp) in groups.items()]


def _placeholder(inp: BatchInput, leaf: int, reason: str) -> EpisodeTrajectory:
    """A row for a leaf that could not be produced: masked out (mask 0, reward 0) so verl's shapes hold."""
    step = StepTrajectory(
        step_id=f"{inp.episode_id}#{leaf}:failed",
        prompt_ids=(0,),
        response_ids=(0,),
        response_mask=(0,),
        logprobs=(0.0,),
        turn_id=inp.target.turn_id,
        meta=StepMeta(turn_id=inp.target.turn_id, extra={"failed": reason}),
    )
    return EpisodeTrajectory(
        episode_id=f"{inp.episode_id}#{leaf}",
        group_id=inp.group_id,
        steps=(step,),
        reward=0.0,
        status=EpisodeStatus.FAILED,
        failure_reason=reason,
    )


def _leaves_for(inp: BatchInput, trajs: list[EpisodeTrajectory], n: int) -> list[EpisodeTrajectory]:
    ok = [t for t in trajs if any(s.turn_role is TurnRole.TARGET for s in t.steps)]
    for t in ok:
        if sum(s.turn_role is TurnRole.TARGET for s in t.steps) != 1:
            raise VerlHookError(
                f"episode {t.episode_id}: a leaf must have exactly one target step for verl rows"
            )
    reason = next((t.failure_reason for t in trajs if t.failure_reason), "no trajectory")
    leaves = ok[:n] + [_placeholder(inp, k, reason or "failed") for k in range(len(ok), n)]
    return leaves


class MemrlRollout:
    """Stand-in for verl's rollout (``generate_sequences``) backed by a memrl :class:`EpisodeRunner`."""

    def __init__(self, runner: Any, builder: Any = None) -> None:
        from memrl.data.batch import TrajectoryBatchBuilder

        self.runner = runner
        self.builder = builder or TrajectoryBatchBuilder()
        self.policy = runner.policy

    @classmethod
    def from_config(cls, cfg: Any, policy: Any = None) -> MemrlRollout:
        from memrl.data.batch import TrajectoryBatchBuilder
        from memrl.episode.build import build_runner

        return cls(build_runner(cfg, policy=policy), TrajectoryBatchBuilder(cfg.data.batch))

    def _run(self, groups: list[tuple[str, list[int], BatchInput]]) -> dict[str, list[EpisodeTrajectory]]:
        """Run each uid's episode with ``rollout.n`` = that uid's row count (one call per distinct count)."""
        out: dict[str, list[EpisodeTrajectory]] = {}
        base = self.runner.rollout_cfg
        by_size: dict[int, list[tuple[str, BatchInput]]] = {}
        for uid, rows, inp in groups:
            by_size.setdefault(len(rows), []).append((uid, dataclasses.replace(inp, group_id=uid)))
        try:
            for n, items in by_size.items():
                self.runner.rollout_cfg = dataclasses.replace(base, n=n)
                trajs = self.runner.run_batch([inp for _, inp in items])
                for uid, inp in items:
                    mine = [t for t in trajs if t.group_id == uid]
                    out[uid] = _leaves_for(inp, mine, n)
        finally:
            self.runner.rollout_cfg = base
        return out

    def generate_sequences(self, prompts: Any) -> Any:
        """verl ``DataProto`` in (rows repeated per sample, ``uid`` per prompt) → ``DataProto`` out, row-aligned."""
        from memrl.data.dataproto import to_dataproto

        t0 = time.perf_counter()
        groups = group_rows(prompts)
        leaves = self._run(groups)
        ordered: list[EpisodeTrajectory | None] = [None] * len(prompts)
        for uid, rows, _ in groups:
            for row, leaf in zip(rows, leaves[uid], strict=True):
                ordered[row] = leaf
        batch = self.builder.build(ordered, layout="padded")
        if batch.num_steps != len(prompts):
            raise VerlHookError(
                f"built {batch.num_steps} rows for {len(prompts)} verl rows (history steps kept?)"
            )
        out = to_dataproto(batch)
        out.meta_info.update(prompts.meta_info)
        out.meta_info["timing"] = {"gen": time.perf_counter() - t0}
        failed = sum(leaf.status is EpisodeStatus.FAILED for leaf in ordered)
        out.meta_info["memrl/failed_rows"] = failed
        return out
