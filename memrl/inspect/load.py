"""Read what ``memrl run`` and ``memrl train`` write, back into typed objects.

``memrl run`` → ``<run>/trajectories/part-*.parquet`` (one row per step, step_meta flattened, nested records as
JSON), ``<run>/manifests/part-*.json`` (one entry per episode, failed ones included) and ``<run>/metrics.json``.
``memrl train`` → ``<run>/metrics.jsonl`` (one line per step), ``<run>/summary.json``, ``<run>/tb/``.

Example::

    from memrl.inspect import load_run
    run = load_run("runs/demo")
    run.episode_ids()            # source episodes (the leaves of one tree are one episode)
    view = run.episode(run.episode_ids()[0])
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.episode.rows import JSON_COLUMNS
from memrl.inspect.model import EpisodeView, build_episode_view

logger = logging.getLogger(__name__)

# Columns the inspector needs; anything else in the Parquet is carried along untouched.
REQUIRED_COLUMNS = (
    "episode_id",
    "source_episode_id",
    "group_id",
    "status",
    "reward",
    "step_index",
    "turn_id",
    "turn_role",
    "response_ids",
    "response_mask",
    "step_reward_ext",
    "tree_id",
    "node_path",
    "branch_depth",
    "is_duplicate",
    "retrieved_ids",
    "cut_fact_ids",
    "tool_calls",
    "rollbacks",
    "memory_ops",
    "extra",
)


_EMPTY: dict[str, Any] = {"extra": {}, "write": None}  # a JSON column's value where a row holds none


class InspectError(ValueError):
    """A run directory is missing, incomplete or malformed. The message names the file and what was expected."""


@dataclass
class Run:
    """A ``memrl run`` output directory, loaded. ``steps`` is a pandas DataFrame (one row per step, Parquet
    order); ``episodes_meta`` the manifest entries (one per leaf trajectory, FAILED ones too)."""

    path: Path
    steps: Any
    episodes_meta: list[dict[str, Any]]
    metrics: dict[str, Any] = field(default_factory=dict)
    _row_index: dict[str, Any] | None = field(default=None, repr=False)

    def episode_ids(self) -> list[str]:
        """Source episode ids in run order (one per input episode; its leaves share it)."""
        return list(dict.fromkeys(e["source_episode_id"] for e in self.episodes_meta))

    def resolve(self, episode_id: str) -> str:
        """A source episode id for ``episode_id`` (a source id or a leaf id such as ``ep-3#2``)."""
        ids = self.episode_ids()
        if episode_id in ids:
            return episode_id
        for e in self.episodes_meta:
            if e["episode_id"] == episode_id:
                return e["source_episode_id"]
        near = ", ".join(ids[:8]) + (" ..." if len(ids) > 8 else "")
        raise InspectError(f"{self.path}: no episode {episode_id!r}; episodes: {near}")

    def rows(self, episode_id: str) -> list[dict[str, Any]]:
        """Step rows of one source episode (all leaves), as dicts with parsed JSON fields."""
        src = self.resolve(episode_id)
        if self._row_index is None:  # one pass over the table, not one filter per episode
            self._row_index = self.steps.groupby("source_episode_id", sort=False).indices
        part = self.steps.iloc[self._row_index.get(src, [])]
        return [
            _parse_row(self.path, int(i), r) for i, r in zip(part.index, part.to_dict("records"), strict=True)
        ]

    def manifest(self, episode_id: str) -> list[dict[str, Any]]:
        src = self.resolve(episode_id)
        return [e for e in self.episodes_meta if e["source_episode_id"] == src]

    def episode(self, episode_id: str) -> EpisodeView:
        """The :class:`~memrl.inspect.model.EpisodeView` of one episode (all its leaves)."""
        return build_episode_view(self.manifest(episode_id), self.rows(episode_id))

    def episode_views(self) -> list[EpisodeView]:
        return [self.episode(e) for e in self.episode_ids()]


def _parse_row(path: Path, index: int, row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for name in JSON_COLUMNS:
        if name not in row:  # a part written before the column existed (the field is still in ``extra``)
            continue
        raw = row.get(name)
        try:
            out[name] = json.loads(raw) if isinstance(raw, str) and raw else _EMPTY.get(name, [])
        except json.JSONDecodeError as exc:
            raise InspectError(
                f"{path}/trajectories: row {index} (episode {row.get('episode_id')!r}) field {name!r} "
                f"is not valid JSON: {exc}"
            ) from exc
    for name in ("response_ids", "response_mask", "node_path", "retrieved_ids", "cut_fact_ids"):
        value = row.get(name)
        out[name] = [] if value is None else [int(x) for x in value]
    return out


def _read_manifests(path: Path) -> list[dict[str, Any]]:
    entries = []
    for p in sorted((path / "manifests").glob("part-*.json")):
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise InspectError(f"{p}: not valid JSON ({exc}); expected a memrl run manifest") from exc
        if not isinstance(data, dict) or not isinstance(data.get("episodes"), list):
            raise InspectError(f"{p}: expected an object with an 'episodes' list (a memrl run manifest)")
        for i, e in enumerate(data["episodes"]):
            missing = {"episode_id", "source_episode_id", "group_id", "status", "reward"} - set(e)
            if missing:
                raise InspectError(f"{p}: episodes[{i}] lacks {sorted(missing)}")
        entries.extend(data["episodes"])
    return entries


def load_run(path: str | Path) -> Run:
    """Load a ``memrl run`` output directory (only committed parts: those with a manifest)."""
    import pandas as pd
    import pyarrow.parquet as pq

    path = Path(path)
    if not (path / "trajectories").is_dir() or not (path / "manifests").is_dir():
        raise InspectError(
            f"{path}: not a memrl run directory (expected trajectories/ and manifests/ as written by `memrl run`)"
        )
    entries = _read_manifests(path)
    committed = {p.stem for p in (path / "manifests").glob("part-*.json")}
    frames = []
    for p in sorted((path / "trajectories").glob("part-*.parquet")):
        if p.stem not in committed:
            logger.warning("%s: no manifest (an interrupted write); skipped as `memrl run` would", p)
            continue
        table = pq.read_table(p)
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise InspectError(f"{p}: missing columns {missing}; is this a `memrl run` trajectory part?")
        frames.append(table.to_pandas())
    if not entries:
        raise InspectError(f"{path}: no committed episodes (manifests/ is empty)")
    steps = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(REQUIRED_COLUMNS))
    metrics = {}
    if (path / "metrics.json").is_file():
        metrics = json.loads((path / "metrics.json").read_text())
    return Run(path=path, steps=steps, episodes_meta=entries, metrics=metrics)


@dataclass
class TrainingRun:
    """A ``memrl train`` output directory: ``metrics`` is a DataFrame of ``metrics.jsonl`` (one row per logged
    line, NaN where a line lacks a key), ``summary`` the parsed ``summary.json`` (empty while training)."""

    path: Path
    metrics: Any
    summary: dict[str, Any]


def load_training(path: str | Path) -> TrainingRun:
    import pandas as pd

    from memrl.train.metrics import read_metrics

    path = Path(path)
    log = path / "metrics.jsonl"
    if not log.is_file():
        raise InspectError(f"{path}: no metrics.jsonl (expected the output_dir of `memrl train`)")
    rows = read_metrics(log)
    if not rows:
        raise InspectError(f"{log}: no complete metric lines yet")
    summary = json.loads((path / "summary.json").read_text()) if (path / "summary.json").is_file() else {}
    return TrainingRun(
        path=path, metrics=pd.DataFrame(rows).sort_values("step", kind="stable"), summary=summary
    )
