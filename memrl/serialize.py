"""Plain-dict round trips of the contracts (debug dumps, Parquet sidecars, replay checkpoints, Ray transport).

:func:`to_dict` turns any contract into JSON-friendly builtins (enums become their values, tuples lists); the
``*_from_dict`` functions build it back and validate it, rejecting unknown fields by name. ``StepMeta`` also reads
what older dumps, replay checkpoints and run directories kept in ``extra`` before it had a typed field: a step
read back trains the same as the step that was written.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from memrl.checks import ContractError
from memrl.types import (
    BatchInput,
    EpisodeTrajectory,
    MemoryOp,
    MemoryWrite,
    PackedBatch,
    PathNode,
    RollbackRecord,
    StepMeta,
    StepTrajectory,
    ToolCallRecord,
    TurnSpec,
)


def to_dict(obj: Any) -> Any:
    """Recursively turn a contract into JSON-friendly builtins (enums → values, tuples → lists)."""
    if isinstance(obj, enum.Enum):
        return obj.value
    if hasattr(obj, "__dataclass_fields__") and not isinstance(obj, PackedBatch):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, Mapping):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def _build(cls: type, data: Mapping[str, Any], nested: Mapping[str, Any]) -> Any:
    names = {f.name for f in fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ContractError(f"{cls.__name__}: unknown fields {sorted(unknown)}; valid: {sorted(names)}")
    kwargs = dict(data)
    for key, conv in nested.items():
        if key in kwargs and kwargs[key] is not None:
            kwargs[key] = conv(kwargs[key])
    return cls(**kwargs)


def turn_from_dict(d: Mapping[str, Any]) -> TurnSpec:
    return _build(TurnSpec, d, {})


def batch_input_from_dict(d: Mapping[str, Any]) -> BatchInput:
    return _build(BatchInput, d, {"turns": lambda ts: tuple(turn_from_dict(t) for t in ts)})


def memory_op_from_dict(d: Mapping[str, Any]) -> MemoryOp:
    return _build(MemoryOp, d, {})


def memory_write_from_dict(d: Mapping[str, Any]) -> MemoryWrite:
    return _build(MemoryWrite, d, {})


def path_node_from_dict(d: Mapping[str, Any]) -> PathNode:
    return _build(PathNode, d, {})


# StepMeta fields that older dumps, replay checkpoints and run directories kept in ``extra``: read from there.
_FIELDS_ONCE_IN_EXTRA = (
    "tree_path",
    "finish",
    "leaf_index",
    "source_episode_id",
    "response_text",
    "included_fact_ids",
    "gold_answer",
    "role",
    "credit_group",
)
# MemoryWrite fields a memory step once kept in ``extra`` (``write_index`` is ``MemoryWrite.index``).
_WRITE_KEYS_ONCE_IN_EXTRA = {
    "write_index": "index",
    **{name: name for name in ("alternative", "alternatives", "applied", "turns_read", "facts_before")},
    **{name: name for name in ("facts_after", "format_errors", "op_score", "gold_ops", "snapshot_reward")},
}


def _lift_from_extra(d: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(d)
    extra = dict(out.get("extra") or {})
    if extra.get("role") == "memory" and out.get("turn_role", "target") != "history":
        extra.pop("role")  # only a history step can be a memory write; the old key named nothing on others
    for name in _FIELDS_ONCE_IN_EXTRA:
        if name in extra:
            out.setdefault(name, extra.pop(name))
    if out.get("finish") == "":  # branches that never finished were written as ""
        out["finish"] = None
    if out.get("role") == "memory" and out.get("write") is None:
        write = {new: extra.pop(old) for old, new in _WRITE_KEYS_ONCE_IN_EXTRA.items() if old in extra}
        op_right = extra.pop("op_right", None)  # steps written before op_score: all right (1) or not (0)
        if "op_score" not in write and op_right is not None:
            write["op_score"] = float(op_right)
        write.setdefault("index", 0)
        out["write"] = write
    extra.pop("op_right", None)  # MemoryWrite.op_right, derived from op_score
    extra.pop("credit", None)  # the step's credit is EpisodeTrajectory.step_rewards_ext
    out["extra"] = extra
    return out


def step_meta_from_dict(d: Mapping[str, Any]) -> StepMeta:
    return _build(
        StepMeta,
        _lift_from_extra(d),
        {
            "tree_path": lambda xs: tuple(path_node_from_dict(x) for x in xs),
            "tool_calls": lambda xs: tuple(_build(ToolCallRecord, x, {}) for x in xs),
            "rollbacks": lambda xs: tuple(_build(RollbackRecord, x, {}) for x in xs),
            "memory_ops": lambda xs: tuple(memory_op_from_dict(x) for x in xs),
            "write": memory_write_from_dict,
        },
    )


def step_from_dict(d: Mapping[str, Any]) -> StepTrajectory:
    return _build(StepTrajectory, d, {"meta": step_meta_from_dict})


def episode_from_dict(d: Mapping[str, Any]) -> EpisodeTrajectory:
    return _build(EpisodeTrajectory, d, {"steps": lambda xs: tuple(step_from_dict(x) for x in xs)})


__all__ = [
    "batch_input_from_dict",
    "episode_from_dict",
    "memory_op_from_dict",
    "memory_write_from_dict",
    "path_node_from_dict",
    "step_from_dict",
    "step_meta_from_dict",
    "to_dict",
    "turn_from_dict",
]
