"""One row per step: the flat form of a trajectory that ``memrl run`` writes to Parquet, and its way back.

:func:`step_rows` flattens ``StepMeta`` into columns (nested records — tree path, tool calls, rollbacks, memory
ops, extra — as JSON text, so every part has one schema); :func:`step_meta_of_row` rebuilds the ``StepMeta`` of a
row, also of parts written before ``tree_path``, ``finish``, ``leaf_index``, ``response_text``,
``included_fact_ids``, ``gold_answer``, ``role``, ``credit_group`` and ``write`` had columns (those kept them in
``extra``). No pyarrow here: the
inspector reads rows through pandas.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from memrl.serialize import step_meta_from_dict, to_dict
from memrl.types import EpisodeTrajectory, StepMeta

# Columns holding JSON text (nested records), and the StepMeta fields read back from plain columns.
JSON_COLUMNS = ("tree_path", "tool_calls", "rollbacks", "memory_ops", "write", "extra")
_PLAIN_META_COLUMNS = (
    "turn_id",
    "turn_role",
    "tree_id",
    "branch_depth",
    "is_duplicate",
    "leaf_index",
    "finish",
    "role",
    "credit_group",
)
_ID_META_COLUMNS = ("node_path", "retrieved_ids", "included_fact_ids", "cut_fact_ids")


def step_rows(trajs: Iterable[EpisodeTrajectory]) -> list[dict[str, Any]]:
    rows = []
    for traj in trajs:
        src = traj.source_episode_id
        for j, step in enumerate(traj.steps):
            meta = step.meta
            ext = traj.step_rewards_ext[j] if traj.step_rewards_ext else None
            rows.append(
                {
                    "episode_id": traj.episode_id,
                    "source_episode_id": src,
                    "group_id": traj.group_id,
                    "sample_index": traj.sample_index,
                    "status": traj.status.value,
                    "reward": traj.reward,
                    "step_index": j,
                    "step_id": step.step_id,
                    "turn_id": step.turn_id,
                    "turn_role": step.turn_role.value,
                    "prompt_ids": list(step.prompt_ids),
                    "response_ids": list(step.response_ids),
                    "response_mask": list(step.response_mask),
                    "logprobs": list(step.logprobs),
                    "step_reward_ext": ext,
                    "tree_id": meta.tree_id,
                    "node_path": list(meta.node_path),
                    "branch_depth": meta.branch_depth,
                    "is_duplicate": meta.is_duplicate,
                    "retrieved_ids": list(meta.retrieved_ids),
                    "cut_fact_ids": list(meta.cut_fact_ids),
                    "included_fact_ids": list(meta.included_fact_ids),
                    "leaf_index": meta.leaf_index,
                    "finish": None if meta.finish is None else meta.finish.value,
                    "role": None if meta.role is None else meta.role.value,
                    "credit_group": meta.credit_group,
                    "response_text": meta.response_text,
                    "gold_answer": meta.gold_answer,
                    "gold_python": meta.gold_python,
                    "num_tool_calls": len(meta.tool_calls),
                    "num_rollbacks": len(meta.rollbacks),
                    "num_memory_ops": len(meta.memory_ops),
                    "memory_op_types": [op.op.value for op in meta.memory_ops],
                    "tree_path": json.dumps(to_dict(meta.tree_path)),
                    "tool_calls": json.dumps(to_dict(meta.tool_calls)),
                    "rollbacks": json.dumps(to_dict(meta.rollbacks)),
                    "memory_ops": json.dumps(to_dict(meta.memory_ops)),
                    "write": json.dumps(to_dict(meta.write)),
                    "extra": json.dumps(to_dict(meta.extra), default=str),
                }
            )
    return rows


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)  # pandas writes a null as NaN


def step_meta_of_row(row: dict[str, Any]) -> StepMeta:
    """The ``StepMeta`` of one row as :func:`step_rows` wrote it (pandas or pyarrow ``to_pylist`` row; JSON
    columns as text or already parsed). Columns a part lacks are taken as their defaults."""
    d: dict[str, Any] = {}
    for name in JSON_COLUMNS:
        value = row.get(name)
        if isinstance(value, str):
            value = json.loads(value) if value else None
        if not _is_missing(value):
            d[name] = value
    for name in _PLAIN_META_COLUMNS:
        if not _is_missing(row.get(name)):
            d[name] = row[name]
    for name in _ID_META_COLUMNS:
        if not _is_missing(row.get(name)):
            d[name] = tuple(int(x) for x in row[name])
    for name in ("leaf_index", "branch_depth"):
        if name in d:
            d[name] = int(d[name])
    if "is_duplicate" in d:
        d["is_duplicate"] = bool(d["is_duplicate"])
    for name in ("response_text", "gold_answer", "gold_python"):
        if isinstance(row.get(name), str):
            d[name] = row[name]
    if isinstance(row.get("source_episode_id"), str):
        d["source_episode_id"] = row["source_episode_id"]
    return step_meta_from_dict(d)
