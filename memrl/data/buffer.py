"""RolloutBuffer: a local buffer of prompt groups in front of the data source, group filters, debug dumps.

Two pluggable stages, two registries with one signature each:

* **before rollout** — :data:`BUFFER_SAMPLERS`, ``(buffer, num_prompts) -> groups``: which pushed-back groups
  (``add_samples``: groups drawn but not needed, aborted episodes to re-run) are taken first. The sampler
  removes what it returns from ``buffer``; the data source fills the rest. Default ``pop_first`` (slime).
* **after rollout** — :data:`GROUP_FILTERS`, ``(groups) -> GroupFilterResult``: which finished groups of
  :class:`EpisodeTrajectory` go to training. ``keep_all`` (default) or ``dynamic_sampling`` (DAPO / slime:
  drop groups whose episode rewards all agree — zero variance means zero GRPO advantage, no signal). Every
  dropped group comes back with its reason and is counted in :attr:`RolloutBuffer.metrics`; nothing vanishes.

:meth:`RolloutBuffer.rollout` is the one path a trainer draws from::

    result = buffer.rollout(runner.run_batch, num_groups=prompts_per_batch, rollout_id=step, max_rounds=4)
    result.groups      # exactly num_groups kept groups (fewer only if max_rounds ran out), in draw order

Each round draws the groups still missing (over-sampled by the keep rate seen so far), runs them, filters them;
kept groups beyond ``num_groups`` go back to the local buffer as prompts, so the next step re-runs them with its
own policy instead of training on stale rollouts. Failed episodes never reach the filter (a failure is not a
reward); they are returned in ``result.episodes`` and counted.

Debug dumps are JSONL (one :func:`memrl.serialize.to_dict` episode per line, one file per rollout id, every round's
episodes in draw order) and replay through :func:`read_rollout_dump` into equal :class:`EpisodeTrajectory`
objects; :func:`select_groups` applied to a dump gives back exactly the groups the rollout trained on.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.data.config import DataConfig
from memrl.data.datasource import RolloutDataSource, write_json_atomic
from memrl.registry import Registry
from memrl.serialize import batch_input_from_dict, episode_from_dict, to_dict
from memrl.types import BatchInput, ContractError, EpisodeStatus, EpisodeTrajectory

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


def has_reward_signal(group: Sequence[EpisodeTrajectory]) -> bool:
    """True when the group's rewards differ, or the credits of one of its memory-write groups do (a write's
    ``k`` alternatives: :mod:`memrl.episode.credit`): only then is any GRPO advantage nonzero."""
    rewards = [ep.reward for ep in group]
    if rewards and max(rewards) - min(rewards) > 1e-12:
        return True
    credits: dict[str, list[float]] = {}
    for ep in group:
        for step, r in zip(ep.steps, ep.step_rewards_ext or (), strict=False):
            if r is not None and step.meta.credit_group is not None:
                credits.setdefault(step.meta.credit_group, []).append(float(r))
    return any(len(c) > 1 and max(c) - min(c) > 1e-12 for c in credits.values())


@GROUP_FILTERS.register("dynamic_sampling")
def dynamic_sampling(groups: Sequence[Sequence[EpisodeTrajectory]]) -> GroupFilterResult:
    """Drop groups whose rewards have zero variance (all equal): their GRPO advantages are all zero. A group whose
    memory writes' alternatives differ in credit is kept (its writes train; the updater skips flat rows).

    A group is every leaf of every copy of one prompt draw (one ``group_id``); a group of one episode always has
    zero answer variance, so give it ``rollout.n >= 2`` leaves or ``data.n_samples_per_prompt >= 2`` copies.
    """
    result = GroupFilterResult(kept=[])
    for group in groups:
        if has_reward_signal(group):
            result.kept.append(list(group))
        else:
            first = group[0].reward if group else None
            result.dropped.append((list(group), f"zero reward variance (every reward is {first})"))
    return result


def group_episodes(episodes: Sequence[EpisodeTrajectory]) -> list[list[EpisodeTrajectory]]:
    """Group episodes by ``group_id``, groups in order of first appearance, episodes in input order."""
    groups: dict[str, list[EpisodeTrajectory]] = {}
    for ep in episodes:
        groups.setdefault(ep.group_id, []).append(ep)
    return list(groups.values())


@dataclass
class DrawnGroups:
    """What :meth:`RolloutBuffer.rollout` produced for one training step."""

    groups: list[list[EpisodeTrajectory]]  # kept groups for training, in draw order
    episodes: list[EpisodeTrajectory]  # everything generated (every round; failed and dropped included)
    rounds: int = 1
    dropped: list[tuple[list[EpisodeTrajectory], str]] = field(default_factory=list)
    pushed_back: set[str] = field(default_factory=set)  # group ids of surplus groups returned as prompts

    @property
    def usable(self) -> list[EpisodeTrajectory]:
        """Finished (not failed) episodes, kept or dropped, but not the surplus whose prompts will run again
        (what a replay buffer may store)."""
        return [
            ep
            for ep in self.episodes
            if ep.status is not EpisodeStatus.FAILED and ep.group_id not in self.pushed_back
        ]


def apply_filter(
    group_filter: GroupFilter, groups: Sequence[Sequence[EpisodeTrajectory]]
) -> GroupFilterResult:
    """Run a group filter and check its contract: every episode comes back, kept or dropped with a reason."""
    result = group_filter(groups)
    out = sum(len(g) for g in result.kept) + sum(len(g) for g, _ in result.dropped)
    total = sum(len(g) for g in groups)
    if out != total:
        name = getattr(group_filter, "__name__", repr(group_filter))
        raise RuntimeError(f"group filter {name!r} lost episodes: {total} in, {out} kept+dropped")
    for group, reason in result.dropped:
        logger.debug("group %s dropped: %s", group[0].group_id if group else "?", reason)
    return result


def select_groups(
    group_filter: GroupFilter, episodes: Sequence[EpisodeTrajectory], num_groups: int | None = None
) -> GroupFilterResult:
    """The filter over the finished episodes grouped by ``group_id``, kept groups cut to the first
    ``num_groups``: what a rollout trains on, computed the same way from live episodes and from a dump."""
    usable = [ep for ep in episodes if ep.status is not EpisodeStatus.FAILED]
    result = apply_filter(group_filter, group_episodes(usable))
    if num_groups is not None and len(result.kept) > num_groups:
        surplus = result.kept[num_groups:]
        result = GroupFilterResult(
            kept=result.kept[:num_groups],
            dropped=result.dropped + [(g, "surplus: the batch was already full") for g in surplus],
        )
    return result


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
        self.group_filter = GROUP_FILTERS.get(group_filter)
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.buffer: list[list[BatchInput]] = []
        self.metrics: dict[str, float] = {
            "buffer/groups_from_buffer": 0,
            "buffer/groups_from_source": 0,
            "buffer/groups_kept": 0,
            "buffer/groups_dropped": 0,
            "buffer/groups_pushed_back": 0,
        }

    @classmethod
    def from_config(cls, config: DataConfig, data_source: RolloutDataSource) -> RolloutBuffer:
        """Build from the data config (``buffer_sampler``, ``group_filter``, ``dump_dir``)."""
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

    def rollout(
        self,
        run: Callable[[list[BatchInput]], list[EpisodeTrajectory]],
        num_groups: int,
        *,
        rollout_id: int = 0,
        max_rounds: int = 1,
    ) -> DrawnGroups:
        """Draw, run and filter groups until ``num_groups`` are kept or ``max_rounds`` rounds have run.

        A round draws the missing groups divided by the keep rate seen so far (at most 4× the missing count,
        so a filter that keeps nothing cannot balloon a round); surplus kept groups go back to the buffer as
        prompts. ``run`` gets the flattened copies and returns their trajectories (``EpisodeRunner.run_batch``).
        """
        if num_groups < 1 or max_rounds < 1:
            raise ValueError(
                f"rollout needs num_groups >= 1 and max_rounds >= 1, got {num_groups}, {max_rounds}"
            )
        kept: list[list[EpisodeTrajectory]] = []
        dropped: list[tuple[list[EpisodeTrajectory], str]] = []
        episodes: list[EpisodeTrajectory] = []
        drawn = rounds = 0
        pushed_back: set[str] = set()
        while len(kept) < num_groups and rounds < max_rounds:
            need = num_groups - len(kept)
            rate = max(len(kept) / drawn, 0.25) if drawn else 1.0
            groups = self.get_samples(min(math.ceil(need / rate), 4 * need))
            drawn, rounds = drawn + len(groups), rounds + 1
            produced = run([item for group in groups for item in group])
            episodes.extend(produced)
            result = select_groups(self.group_filter, produced)
            taken, surplus = result.kept[:need], result.kept[need:]
            kept.extend(taken)
            dropped.extend(result.dropped)
            self.metrics["buffer/groups_kept"] += len(taken)
            self.metrics["buffer/groups_dropped"] += len(result.dropped)
            if surplus:
                pushed_back = {g[0].group_id for g in surplus}
                self.buffer.extend(g for g in groups if g[0].group_id in pushed_back)
                self.metrics["buffer/groups_pushed_back"] += len(pushed_back)
        if len(kept) < num_groups:
            logger.info(
                "rollout %d: %d of %d groups kept after %d round(s) (data.max_sampling_rounds)",
                rollout_id,
                len(kept),
                num_groups,
                rounds,
            )
        self.dump_rollout(rollout_id, episodes)
        return DrawnGroups(kept, episodes, rounds, dropped, pushed_back)

    def filter_groups(self, groups: Sequence[Sequence[EpisodeTrajectory]]) -> list[list[EpisodeTrajectory]]:
        """Apply the post-rollout group filter; dropped groups are logged and counted."""
        result = apply_filter(self.group_filter, groups)
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
