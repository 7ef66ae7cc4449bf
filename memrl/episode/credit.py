"""Step-wise credit for policy-written memory: who gets what reward among an episode's memory writes.

One registry, :data:`STEP_CREDITS`, one signature::

    fn(inp: CreditInput) -> list[float | None]     # one outcome share per memory step (None: not trained)

* ``broadcast`` — the episode's outcome to every memory step (MemAgent, ReSum).
* ``used`` — the outcome to the steps that wrote a fact the answer's prompt carried, 0 to the rest.
* ``snapshot`` — the steps sampled as ``k`` alternatives from one store state (Memory-R1): each alternative's
  own outcome, measured by answering the episode's question on a copy of the store with that alternative
  applied (:mod:`memrl.episode.snapshot`). The ``k`` alternatives of one write are one GRPO group. Writes that
  were not sampled so get ``None``: they train nothing.
* ``local`` — ``k`` alternatives from one store state at *every* write, scored by the per-step terms alone (no
  answering, outcome share 0): for datasets that know each turn's operation (the synthetic task). The group then
  compares only replies to the same prompt, so a write's advantage says which reply was better there. Under
  ``used`` or ``broadcast`` one group holds all of an episode's writes, made from different states: a right
  UPDATE on a turn the question never asks about is pushed down beside a right ADD whose fact was used.

How the terms combine (:func:`step_rewards`), for a step that has an outcome share ``o``::

    reward = o + format_weight · [every line was a valid operation]
               + op_weight · op_score (its operations against the dataset's, where the dataset knows them)
               - size_weight · (current facts after the write / history turns read so far)

``op_score`` (:func:`memrl.memory.gold.ops_score`) is the F1 of the write's operations against the gold ones, so a
six-line write with one borrowed value still earns most of the term: paid only for a fully right write, the term
reached 0–17 % of sampled session writes and gave RL little to climb. The op term is absent where the dataset does not say (LoCoMo, LongMemEval: outcome only); ``op_weight = 0``
drops it everywhere (the outcome-only arm). Group ids: ``<group>/memory`` for ``broadcast`` / ``used`` (every
memory step of a prompt's episodes is compared with the others), ``<group>/memory/<write>`` per ``snapshot`` or
``local`` write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from memrl.episode.config import MemoryCreditConfig
from memrl.registry import Registry
from memrl.types import MemoryOpType, StepTrajectory

MEMORY_ROLE = "memory"  # StepMeta.extra["role"] of a memory-write step


@dataclass(frozen=True)
class CreditInput:
    """``steps``: the episode's memory-write steps in order (snapshot alternatives included); ``outcome``: its
    mean leaf reward; ``used_fact_ids``: the facts the answer's prompt carried."""

    steps: tuple[StepTrajectory, ...]
    outcome: float
    used_fact_ids: frozenset[int]


CreditFn = Callable[[CreditInput], list[float | None]]
STEP_CREDITS: Registry[CreditFn] = Registry("memory step credit")


def written_ids(step: StepTrajectory) -> set[int]:
    """Facts a step's applied operations wrote (an UPDATE's new fact included)."""
    return {
        fid
        for op in step.meta.memory_ops
        if op.op in (MemoryOpType.ADD, MemoryOpType.UPDATE)
        for fid in op.fact_ids
    }


@STEP_CREDITS.register("broadcast")
def broadcast(inp: CreditInput) -> list[float | None]:
    return [inp.outcome if s.meta.extra.get("applied", True) else None for s in inp.steps]


@STEP_CREDITS.register("used")
def used(inp: CreditInput) -> list[float | None]:
    out: list[float | None] = []
    for s in inp.steps:
        if not s.meta.extra.get("applied", True):
            out.append(None)
        else:
            out.append(inp.outcome if written_ids(s) & inp.used_fact_ids else 0.0)
    return out


@STEP_CREDITS.register("snapshot")
def snapshot(inp: CreditInput) -> list[float | None]:
    return [s.meta.extra.get("snapshot_reward") for s in inp.steps]


snapshot.answers = True  # type: ignore[attr-defined]  # k replies at planned writes, each scored by answering


@STEP_CREDITS.register("local")
def local(inp: CreditInput) -> list[float | None]:
    return [0.0 for _ in inp.steps]


local.every_write = True  # type: ignore[attr-defined]  # k replies at every write, not only planned ones


def samples_alternatives(name: str) -> bool:
    """The runner samples ``k`` replies at some writes (planned ``snapshot`` writes, or every ``local`` one)."""
    return answers_alternatives(name) or alternatives_at_every_write(name)


def answers_alternatives(name: str) -> bool:
    """Each sampled alternative is scored by answering the question on its own copy of the store."""
    return bool(getattr(STEP_CREDITS.get(name), "answers", False))


def alternatives_at_every_write(name: str) -> bool:
    return bool(getattr(STEP_CREDITS.get(name), "every_write", False))


def step_rewards(inp: CreditInput, cfg: MemoryCreditConfig) -> list[float | None]:
    """The credit function's outcome shares plus the per-step terms (module docstring)."""
    shares = STEP_CREDITS.get(cfg.name)(inp)
    if len(shares) != len(inp.steps):
        raise RuntimeError(f"step credit {cfg.name!r} gave {len(shares)} rewards for {len(inp.steps)} steps")
    out: list[float | None] = []
    for step, share in zip(inp.steps, shares, strict=True):
        if share is None:
            out.append(None)
            continue
        extra = step.meta.extra
        reward = float(share) + cfg.format_weight * float(not extra.get("format_errors"))
        op_score = extra.get(
            "op_score", extra.get("op_right")
        )  # op_right alone: steps dumped before op_score
        if op_score is not None and cfg.op_weight:
            reward += cfg.op_weight * float(op_score)
        if cfg.size_weight:
            reward -= cfg.size_weight * extra.get("facts_after", 0) / max(1, extra.get("turns_read", 1))
        out.append(reward)
    return out


def credit_group(group_id: str, step: StepTrajectory) -> str:
    """The GRPO group of a memory step: the ``k`` alternatives of one snapshot write form their own group."""
    if step.meta.extra.get("alternatives", 1) > 1:
        return f"{group_id}/memory/{step.meta.extra.get('write_index', 0)}"
    return f"{group_id}/memory"
