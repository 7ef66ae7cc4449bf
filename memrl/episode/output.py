"""Trajectories on disk: Parquet parts (one row per step) + per-part JSON manifests (one entry per episode).

    <output_dir>/trajectories/part-00000.parquet   rows = steps; step_meta flattened into columns
    <output_dir>/manifests/part-00000.json         every episode of the part (incl. FAILED ones, which have no
                                                   steps), with status, reward, failure_reason, metrics

A part is committed by writing its Parquet file and then its manifest, each atomically (temp file + fsync +
rename). Resume trusts manifests only: a Parquet part without a manifest (crash between the two writes) is
deleted and its episodes re-run, so no episode is lost or written twice.

Read back with ``pandas.read_parquet(out / "trajectories")`` or
``datasets.load_dataset("parquet", data_files=str(out / "trajectories" / "*.parquet"))``.
Nested step_meta records (tree path, tool calls, rollbacks, memory ops, extra) are JSON strings so every part
has the same schema; ids and masks are native integer lists. The rows themselves (both directions) are
:mod:`memrl.episode.rows`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from memrl.config import Config
from memrl.episode.rows import step_rows
from memrl.types import EpisodeTrajectory

SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("source_episode_id", pa.string()),
        ("group_id", pa.string()),
        ("sample_index", pa.int64()),
        ("status", pa.string()),
        ("reward", pa.float64()),
        ("step_index", pa.int64()),
        ("step_id", pa.string()),
        ("turn_id", pa.string()),
        ("turn_role", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("step_reward_ext", pa.float64()),
        ("tree_id", pa.string()),
        ("node_path", pa.list_(pa.int32())),
        ("branch_depth", pa.int64()),
        ("is_duplicate", pa.bool_()),
        ("retrieved_ids", pa.list_(pa.int64())),
        ("cut_fact_ids", pa.list_(pa.int64())),
        ("included_fact_ids", pa.list_(pa.int64())),
        ("leaf_index", pa.int64()),
        ("finish", pa.string()),
        ("role", pa.string()),
        ("credit_group", pa.string()),
        ("response_text", pa.string()),
        ("gold_answer", pa.string()),
        ("gold_python", pa.string()),
        ("num_tool_calls", pa.int64()),
        ("num_rollbacks", pa.int64()),
        ("num_memory_ops", pa.int64()),
        ("memory_op_types", pa.list_(pa.string())),
        ("tree_path", pa.string()),
        ("tool_calls", pa.string()),
        ("rollbacks", pa.string()),
        ("memory_ops", pa.string()),
        ("write", pa.string()),
        ("extra", pa.string()),
    ]
)


def episode_entry(traj: EpisodeTrajectory) -> dict[str, Any]:
    return {
        "episode_id": traj.episode_id,
        "source_episode_id": traj.source_episode_id,
        "group_id": traj.group_id,
        "status": traj.status.value,
        "reward": traj.reward,
        "failure_reason": traj.failure_reason,
        "num_steps": len(traj.steps),
        "metrics": dict(traj.metrics),
    }


def _atomic_write_bytes(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class TrajectoryWriter:
    """Appends committed parts under ``out_dir``; knows which input episodes are already done."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out = Path(out_dir)
        self.parts_dir = self.out / "trajectories"
        self.manifest_dir = self.out / "manifests"
        self.parts_dir.mkdir(parents=True, exist_ok=True)
        self.manifest_dir.mkdir(parents=True, exist_ok=True)
        self._discard_uncommitted()
        self.next_part = len(list(self.manifest_dir.glob("part-*.json")))

    def _discard_uncommitted(self) -> None:
        committed = {p.stem for p in self.manifest_dir.glob("part-*.json")}
        for p in list(self.parts_dir.glob("part-*.parquet*")) + list(self.manifest_dir.glob("*.tmp")):
            if p.suffix == ".tmp" or p.name.split(".")[0] not in committed:
                p.unlink()

    def manifests(self) -> list[dict[str, Any]]:
        """Every committed episode entry, in part order."""
        out = []
        for p in sorted(self.manifest_dir.glob("part-*.json")):
            out.extend(json.loads(p.read_text())["episodes"])
        return out

    def done_ids(self) -> set[str]:
        return {e["source_episode_id"] for e in self.manifests()}

    def write(self, trajs: Sequence[EpisodeTrajectory]) -> Path:
        name = f"part-{self.next_part:05d}"
        table = pa.Table.from_pylist(step_rows(trajs), schema=SCHEMA)
        _atomic_write_bytes(self.parts_dir / f"{name}.parquet", lambda p: pq.write_table(table, p))
        manifest = json.dumps({"part": name, "episodes": [episode_entry(t) for t in trajs]}, default=str)
        _atomic_write_bytes(self.manifest_dir / f"{name}.json", lambda p: p.write_text(manifest))
        self.next_part += 1
        return self.parts_dir / f"{name}.parquet"


def job_identity(cfg: Config) -> dict[str, Any]:
    """What must not change between a run and its resumption: the config (minus where results go and how work is
    spread over workers, which leave results unchanged) and the policy weights actually resolved (an alias names
    the converted directory, versioned by its package, so a new embedded model is a new identity)."""
    import dataclasses

    from memrl.policy.models import resolve_model_path

    ident = dataclasses.asdict(cfg)
    for key in ("output_dir", "train"):
        ident.pop(key, None)
    ident.get("episode", {}).pop("worker", None)
    model = Path(resolve_model_path(cfg.policy.model))
    weights = model / "model.safetensors"
    ident["resolved_model"] = {
        "path": model.name if model.exists() else str(model),
        "bytes": weights.stat().st_size if weights.is_file() else None,
    }
    return json.loads(json.dumps(ident, default=str))


def check_job_identity(out_dir: str | Path, identity: dict[str, Any], has_results: bool) -> None:
    """Refuse to resume ``out_dir`` with a different job (its results would mix two configs or models)."""
    path = Path(out_dir) / "job.json"
    if has_results and path.is_file():
        old = json.loads(path.read_text())
        if old != identity:
            diff = sorted(k for k in set(old) | set(identity) if old.get(k) != identity.get(k))
            raise ValueError(
                f"{out_dir} holds results of a different job (changed: {', '.join(diff)}); "
                "rerun with --fresh to discard them, or choose another output_dir"
            )
    write_json(path, identity)


def write_json(path: str | Path, payload: Any) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(payload, indent=2, sort_keys=True, default=str)
    _atomic_write_bytes(path, lambda p: p.write_text(text + "\n"))
