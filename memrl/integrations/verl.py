"""verl integration, data side: dataset rows for verl's ``RLHFDataset`` and the mapping back to memrl episodes.

memrl runs inside verl's own trainer as a verl *agent loop* (:mod:`memrl.integrations.verl_agent_loop`,
registered as ``memrl``): verl's dataloader hands each sample's dataset row to the loop, which runs memrl's
episode (memory ingest + retrieval → prompt → generation through verl's servers, tools, rollback → reward) and
returns one trainable sequence (with a policy-written memory: its credited writes, then the answer,
:mod:`memrl.integrations.verl_rows`). This module holds what needs no verl import:

- :func:`verl_dataset_rows` writes the rows (the whole :class:`~memrl.types.BatchInput` as one JSON string in
  ``extra_info["memrl_input"]``: a string column survives Parquet, where nested dicts with empty or varying
  ``metadata`` do not);
- :func:`episode_input` reads a row's episode back (JSON string, dict or ``BatchInput``);
- :func:`select_leaves` turns an episode's trajectories into exactly ``n`` leaves, one per verl sample.

Recipe, config and limits: ``docs/verl.md``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from memrl.serialize import batch_input_from_dict, to_dict
from memrl.types import BatchInput, EpisodeStatus, EpisodeTrajectory, StepMeta, StepTrajectory, TurnRole

INPUT_KEY = "memrl_input"
AGENT_NAME = "memrl"
INSTALL_HINT = (
    "memrl's verl agent loop needs verl 0.9.x and the packages its agent loop imports; "
    "`.ci/verl.sh --install-only` builds such an environment (see docs/verl.md)"
)


class VerlDataError(ValueError):
    """A verl sample cannot be mapped to a memrl episode; the message names the sample and the key."""


def verl_dataset_rows(inputs: Sequence[BatchInput], data_source: str = "memrl") -> list[dict[str, Any]]:
    """Rows for verl's ``RLHFDataset`` Parquet (``pd.DataFrame(rows).to_parquet(path)``).

    ``prompt`` is the question as a chat message (verl's dataset filters and logs it; memrl builds the real
    prompt, with memory, itself), ``reward_model.ground_truth`` the gold answer for verl's bookkeeping,
    ``agent_name`` selects memrl's agent loop, and ``extra_info`` carries the episode as JSON plus verl's
    ``index``.

    >>> rows = verl_dataset_rows(inputs)
    >>> pd.DataFrame(rows).to_parquet("train.parquet")   # data.train_files=train.parquet
    """
    return [
        {
            "data_source": data_source,
            "agent_name": AGENT_NAME,
            "prompt": [{"role": "user", "content": inp.final_query}],
            "reward_model": {"style": "rule", "ground_truth": inp.target_answer or ""},
            "extra_info": {INPUT_KEY: json.dumps(to_dict(inp)), "index": i},
        }
        for i, inp in enumerate(inputs)
    ]


def episode_input(extra_info: Any, *, sample: str = "?") -> BatchInput:
    """The episode of one verl sample from its ``extra_info`` (as :func:`verl_dataset_rows` wrote it)."""
    raw = extra_info.get(INPUT_KEY) if isinstance(extra_info, Mapping) else None
    if raw is None:
        raise VerlDataError(
            f"verl sample {sample}: extra_info has no {INPUT_KEY!r}; write the dataset with "
            "memrl.integrations.verl.verl_dataset_rows"
        )
    if isinstance(raw, BatchInput):
        return raw
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise VerlDataError(
                f"verl sample {sample}: extra_info[{INPUT_KEY!r}] is not JSON: {exc}"
            ) from exc
    if not isinstance(raw, Mapping):
        raise VerlDataError(
            f"verl sample {sample}: extra_info[{INPUT_KEY!r}] must be a BatchInput, its dict or its JSON; "
            f"got {type(raw).__name__}"
        )
    return batch_input_from_dict(raw)


def target_step(traj: EpisodeTrajectory) -> StepTrajectory:
    """The one trainable (target) step of a leaf; history steps, if kept, are memory bookkeeping only."""
    steps = [s for s in traj.steps if s.turn_role is TurnRole.TARGET]
    if len(steps) != 1:
        raise VerlDataError(
            f"episode {traj.episode_id}: a verl sample takes exactly one target step, found {len(steps)}"
        )
    return steps[0]


def _placeholder(inp: BatchInput, leaf: int, reason: str) -> EpisodeTrajectory:
    """A leaf that could not be produced (its episode failed on its data): one masked token, reward 0, so
    verl's batch keeps its shape and the sample trains on nothing."""
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


def select_leaves(inp: BatchInput, trajs: Sequence[EpisodeTrajectory], n: int) -> list[EpisodeTrajectory]:
    """Exactly ``n`` leaves of ``inp``'s episode: its trajectories that reached the target turn, in order, then
    FAILED placeholders for the rest (with the episode's failure reason)."""
    ok = [t for t in trajs if any(s.turn_role is TurnRole.TARGET for s in t.steps)]
    for t in ok:
        target_step(t)  # validates: one target step per leaf
    reason = next((t.failure_reason for t in trajs if t.failure_reason), None) or "no trajectory"
    return ok[:n] + [_placeholder(inp, k, reason) for k in range(len(ok), n)]
