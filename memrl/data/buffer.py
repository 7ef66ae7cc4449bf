"""RolloutBuffer: a local buffer of prompt groups in front of the data source, group filters, debug dumps.

Two pluggable stages, two registries with one signature each:

* **before rollout** — :data:`BUFFER_SAMPLERS`, ``(buffer, num_prompts) -> groups``: which pushed-back groups
  (``add_samples``: aborted episodes to re-run, partial rollouts) are taken first. The sampler removes what it
  returns from ``buffer``; the data source fills the rest. Default ``pop_first`` (slime).
* **after rollout** — :data:`GROUP_FILTERS`, ``(groups) -> GroupFilterResult``: which finished groups of
  :class:`EpisodeTrajectory` go to training. ``keep_all`` (default) or ``dynamic_sampling`` (DAPO / slime:
  drop groups whose episode rewards all agree — zero variance means zero GRPO advantage, no signal). Every
  dropped group comes back with its reason and is counted in :attr:`RolloutBuffer.metrics`; nothing vanishes.

A trainer loop reads::

    groups = buffer.get_samples(cfg.prompts_per_batch)       # list[list[BatchInput]]
    episodes = runner.run_batch([x for g in groups for x in g])
    buffer.dump_rollout(rollout_id, episodes)                  # if dump_dir is set
    kept = buffer.filter_groups(group_episodes(episodes))       # list[list[EpisodeTrajectory]]

Debug dumps are JSONL (one :func:`memrl.types.to_dict` episode per line, one file per rollout id) and replay
through :func:`read_rollout_dump` into equal :class:`EpisodeTrajectory` objects.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.data.datasource import RolloutDataSource, write_json_atomic
from memrl.registry import Registry
from memrl.types import (
    BatchInput,
    ContractError,
    EpisodeTrajectory,
    batch_input_from_dict,
    episode_from_dict,
    to_dict,
)

logger = logging.getLogger(__name__)

BufferSampler = Callable[[list[list[BatchInput]], int], list[list[BatchInput]]]


@dataclass
class GroupFilterResult:
    """Outcome of a post-rollout group filter: kept groups, and dropped groups each with a reason."""

    kept: list[list[EpisodeTrajectory]]
    dropped: list[tuple[list[EpisodeTrajectory], str]] = field(default_factory=list)


GroupFilter = Callable[[Sequence[Sequence[EpisodeTrajectory]]], GroupFilterResult]

BUFFER_SAMPLERS: Registry[BufferSampler] = Registry("buffer sampler")
GROUP_FILTERS: Registry[GroupFilter] = Registry("group filter")


@BUFFER_SAMPLERS.register("pop_first")
def pop_first(buffer: list[list[BatchInput]], num_prompts: int) -> list[list[BatchInput]]:
    """Oldest pushed-back groups first (FIFO), at most ``num_prompts`` of them."""
    taken = buffer[:num_prompts]
    del buffer[:num_prompts]
    return taken


@GROUP_FILTERS.register("keep_all")
def keep_all(groups: Sequence[Sequence[EpisodeTrajectory]]) -> GroupFilterResult:
    return GroupFilterResult(kept=[list(g) for g in groups])


@GROUP_FILTERS.register("dynamic_sampling")
def dynamic_sampling(groups: Sequence[Sequence[EpisodeTrajectory]]) -> GroupFilterResult:
    """Drop groups whose rewards have zero variance (all equal): their GRPO advantages are all zero.

    Groups of one episode always have zero variance and are dropped too; sample ``n_samples_per_prompt >= 2``.
    """
    result = GroupFilterResult(kept=[])
    for group in groups:
        rewards = [ep.reward for ep in group]
        if rewards and max(rewards) - min(rewards) > 1e-12:
            result.kept.append(list(group))
        else:
            result.dropped.append((list(group), f"zero reward variance (all rewards {rewards[:1]})"))
    return result


def group_episodes(episodes: Sequence[EpisodeTrajectory]) -> list[list[EpisodeTrajectory]]:
    """Group episodes by ``group_id``, groups in order of first appearance, episodes in input order."""
    groups: dict[str, list[EpisodeTrajectory]] = {}
    for ep in episodes:
        groups.setdefault(ep.group_id, []).append(ep)
    return list(groups.values())


# -- debug dumps ---------------------------------------------------------------------------------------------


class RolloutDumpError(ValueError):
    """A rollout dump file cannot be replayed; the message names the file and line."""


def write_rollout_dump(path: str | Path, episodes: Sequence[EpisodeTrajectory]) -> Path:
    """Write episodes as JSONL (one episode per line). Written to a temp name first, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for ep in episodes:
            fh.write(json.dumps(to_dict(ep), ensure_ascii=False, sort_keys=True))
            fh.write("\n")
    tmp.replace(path)
    return path


def read_rollout_dump(path: str | Path) -> list[EpisodeTrajectory]:
    """Replay a dump written by :func:`write_rollout_dump`."""
    path = Path(path)
    episodes = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                episodes.append(episode_from_dict(json.loads(line)))
            except (json.JSONDecodeError, ContractError, TypeError) as exc:
                raise RolloutDumpError(f"{path}:{lineno}: not a valid episode record: {exc}") from exc
    return episodes


# -- the buffer ------------------------------------------------------------------------------------------------


def _check_group(group: Any, where: str) -> list[BatchInput]:
    if not isinstance(group, (list, tuple)) or not group:
        raise ValueError(f"{where}: expected a non-empty list of BatchInput, got {group!r:.80}")
    for j, item in enumerate(group):
        if not isinstance(item, BatchInput):
            raise TypeError(f"{where}[{j}]: expected BatchInput, got {type(item).__name__}")
    ids = {item.group_id for item in group}
    if len(ids) != 1:
        raise ValueError(f"{where}: one group must share one group_id, got {sorted(ids)}")
    return list(group)


class RolloutBuffer:
    """Local buffer of prompt groups first, then the data source (slime's Buffer, without the Ray actor).

    Args:
        data_source: where new groups come from.
        sampler: :data:`BUFFER_SAMPLERS` name or dotted path (pre-rollout).
        group_filter: :data:`GROUP_FILTERS` name or dotted path (post-rollout).
        dump_dir: if set, :meth:`dump_rollout` writes ``rollout_<id>.jsonl`` here.
    """

    def __init__(
        self,
        data_source: RolloutDataSource,
        *,
        sampler: str = "pop_first",
        group_filter: str = "keep_all",
        dump_dir: str | Path | None = None,
    ) -> None:
        self.data_source = data_source
        self.sampler_name, self.group_filter_name = sampler, group_filter
        self._sampler = BUFFER_SAMPLERS.get(sampler)
        self._group_filter = GROUP_FILTERS.get(group_filter)
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.buffer: list[list[BatchInput]] = []
        self.metrics: dict[str, float] = {
            "buffer/groups_from_buffer": 0,
            "buffer/groups_from_source": 0,
            "buffer/groups_kept": 0,
            "buffer/groups_dropped": 0,
        }

    @classmethod
    def from_config(cls, config: Any, data_source: RolloutDataSource) -> RolloutBuffer:
        """Build from a :class:`memrl.data.config.DataConfig` (``buffer_sampler``, ``group_filter``, ``dump_dir``)."""
        return cls(
            data_source,
            sampler=config.buffer_sampler,
            group_filter=config.group_filter,
            dump_dir=config.dump_dir,
        )

    def __len__(self) -> int:
        return len(self.buffer)

    def add_samples(self, groups: Sequence[Sequence[BatchInput]]) -> None:
        """Push groups back (e.g. aborted episodes to re-run); they are served before new data."""
        checked = [_check_group(g, f"add_samples: group {i}") for i, g in enumerate(groups)]
        self.buffer.extend(checked)

    def get_samples(self, num_prompts: int) -> list[list[BatchInput]]:
        """``num_prompts`` groups: from the local buffer (via the sampler), the rest from the data source."""
        if num_prompts < 0:
            raise ValueError(f"num_prompts must be >= 0, got {num_prompts}")
        before = len(self.buffer)
        groups = self._sampler(self.buffer, num_prompts) if self.buffer else []
        if len(groups) > num_prompts or len(self.buffer) != before - len(groups):
            raise RuntimeError(
                f"buffer sampler {self.sampler_name!r} broke its contract: returned {len(groups)} groups for "
                f"{num_prompts} requested and left {len(self.buffer)} of {before} in the buffer"
            )
        self.metrics["buffer/groups_from_buffer"] += len(groups)
        rest = num_prompts - len(groups)
        if rest:
            groups = groups + self.data_source.get_samples(rest)
            self.metrics["buffer/groups_from_source"] += rest
        return groups

    def filter_groups(self, groups: Sequence[Sequence[EpisodeTrajectory]]) -> list[list[EpisodeTrajectory]]:
        """Apply the post-rollout group filter; dropped groups are logged and counted."""
        result = self._group_filter(groups)
        kept_n = sum(len(g) for g in result.kept) + sum(len(g) for g, _ in result.dropped)
        total = sum(len(g) for g in groups)
        if kept_n != total:
            raise RuntimeError(
                f"group filter {self.group_filter_name!r} lost episodes: {total} in, {kept_n} kept+dropped"
            )
        for group, reason in result.dropped:
            logger.debug("group %s dropped: %s", group[0].group_id if group else "?", reason)
        self.metrics["buffer/groups_kept"] += len(result.kept)
        self.metrics["buffer/groups_dropped"] += len(result.dropped)
        return result.kept

    # -- debug dump / replay --------------------------------------------------------------------------------

    def _dump_path(self, rollout_id: int) -> Path:
        if self.dump_dir is None:
            raise ValueError("RolloutBuffer has no dump_dir; set data.dump_dir to dump or replay rollouts")
        return self.dump_dir / f"rollout_{int(rollout_id):06d}.jsonl"

    def dump_rollout(self, rollout_id: int, episodes: Sequence[EpisodeTrajectory]) -> Path | None:
        """Write the raw episodes of one rollout (no-op returning None when no dump_dir is set)."""
        if self.dump_dir is None:
            return None
        return write_rollout_dump(self._dump_path(rollout_id), episodes)

    def load_rollout(self, rollout_id: int) -> list[EpisodeTrajectory]:
        """Replay the episodes dumped for ``rollout_id`` (debugging a training step without re-running it)."""
        return read_rollout_dump(self._dump_path(rollout_id))

    # -- resumable state --------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Data-source progress plus the pushed-back groups, so a resume loses neither."""
        return {
            "data_source": self.data_source.state_dict(),
            "buffer": [[to_dict(x) for x in g] for g in self.buffer],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.data_source.load_state_dict(state["data_source"])
        self.buffer = [[batch_input_from_dict(x) for x in g] for g in state["buffer"]]

    def save(self, path: str | Path) -> None:
        write_json_atomic(path, self.state_dict())

    def load(self, path: str | Path) -> None:
        self.load_state_dict(json.loads(Path(path).read_text(encoding="utf-8")))
