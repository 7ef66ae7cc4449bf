"""The rows one verl sample trains on, from its memrl leaf: the credited memory writes, then the answer.

With ``memory.extractor: policy`` the leaf that carries an episode's memory writes (leaf 0) becomes several verl
rows: each write that has a step credit (:mod:`memrl.episode.credit`) is a row of its own, with its own reward
(the credit) and its own GRPO group (``broadcast`` / ``used``: ``<group>/memory``; ``snapshot`` / ``local``:
``<group>/memory/<write>``), followed by the answer row (the episode reward, group = verl's ``uid``). The rows are
exactly those of memrl's :class:`~memrl.data.batch.TrajectoryBatchBuilder` (``untrained_steps=drop``) after
:func:`memrl.train.roles.keep_roles`: they are built by the same function, :func:`memrl.data.batch.rows_from_episodes`.
A write with no credit (a snapshot write that was not sampled, an alternative that was not applied under
``broadcast``) is not a row: it trains nothing in memrl either.

Every row carries what memrl's advantage needs in verl's ``extra_fields`` (:func:`row_fields`); the trainer side
(:mod:`memrl.integrations.verl_credit`) reads them back. Importable without verl.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memrl.data.batch import BatchRow, rows_from_episodes
from memrl.data.config import BatchConfig
from memrl.types import EpisodeTrajectory, StepMeta, StepRole, TurnRole

ANSWER, MEMORY = "answer", "memory"
# verl's name of memrl's advantage estimator, and the module that registers it (memrl.integrations.verl_credit)
ESTIMATOR, CREDIT_MODULE = "memrl_step_credit", "memrl.integrations.verl_credit"
# extra_fields keys the trainer side reads (memrl.integrations.verl_credit)
ROLE_KEY, GROUP_KEY, REWARD_KEY, WEIGHT_KEY = (
    "memrl_role",
    "memrl_credit_group",
    "memrl_reward",
    "memrl_weight",
)


def step_credit_fields(meta: StepMeta) -> tuple[str | None, str | None]:
    """``(role, credit group)`` of a step: ``("answer", None)`` for a target step (its group is the episode's),
    ``("memory", "<group>/memory...")`` for a credited policy write, ``(None, None)`` otherwise.

    The one place this integration reads the step contract's typed ``role`` and ``credit_group``."""
    if meta.turn_role is TurnRole.TARGET:
        return ANSWER, None
    if meta.role is StepRole.MEMORY:
        return MEMORY, meta.credit_group
    return None, None


@dataclass(frozen=True)
class VerlRow:
    """One verl row: memrl's batch row plus its role and loss weight (0: a tree leaf's duplicate)."""

    row: BatchRow
    role: str
    weight: float = 1.0

    @property
    def group(self) -> str:
        return self.row.group_id


def leaf_rows(leaf: EpisodeTrajectory, roles: Sequence[str]) -> list[VerlRow]:
    """The rows of one leaf that train the roles in ``roles``, in step order (writes first, then the answer).

    Rows come from :func:`rows_from_episodes` as memrl's own batch builds them; rows of other roles are dropped
    (``train.roles`` / ``role_schedule``, as :func:`memrl.train.roles.keep_roles` drops them)."""
    if not any(s.turn_role is TurnRole.TARGET for s in leaf.steps):
        return []
    out = []
    for row in rows_from_episodes([leaf], BatchConfig(untrained_steps="drop")):
        role, _ = step_credit_fields(row.meta)
        if role is None or role not in roles:
            continue
        out.append(VerlRow(row, role, 0.0 if row.meta.is_duplicate else 1.0))
    return out


def credit_module_loaded(verl_config: Any) -> bool:
    """Whether verl's config makes its processes import :data:`CREDIT_MODULE`
    (``actor_rollout_ref.model.external_lib`` or ``VERL_USE_EXTERNAL_MODULES``)."""
    import os

    libs = verl_config.actor_rollout_ref.model.get("external_lib", None) or []
    libs = [libs] if isinstance(libs, str) else list(libs)
    libs += os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",")
    return CREDIT_MODULE in libs


def row_fields(row: VerlRow) -> dict[str, Any]:
    """The ``extra_fields`` entries the trainer side reads: role, credit group, the row's own reward (verl's
    ``_agent_loop_postprocess`` overwrites ``reward_score`` of all but a sample's last output) and loss weight."""
    return {
        ROLE_KEY: row.role,
        GROUP_KEY: row.group,
        REWARD_KEY: float(row.row.reward),
        WEIGHT_KEY: float(row.weight),
    }
