"""Step-wise credit for policy-written memory: who gets what reward among an episode's memory writes.

One registry, :data:`STEP_CREDITS`, of :class:`StepCredit` entries: a typed :class:`CreditSpec` (where the runner
samples alternative replies, how they are scored) and one function with one signature::

    shares(inp: CreditInput) -> list[float | None]     # one outcome share per memory step (None: not trained)

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
               - unsupported_weight · [a written fact is invented: a name or value the turns read lack]

``op_score`` (:func:`memrl.memory.gold.ops_score`) is the F1 of the write's operations against the gold ones, so a
six-line write with one borrowed value still earns most of the term: paid only for a fully right write, the term
rarely paid and gave RL little to climb. The op term is absent where the dataset does not say (LoCoMo,
LongMemEval: outcome only); ``op_weight = 0`` drops it everywhere (the outcome-only arm). The unsupported term
(:mod:`memrl.memory.faithfulness`) needs no gold: it charges a write that states what it did not read ("Diego is a
musician." from "Makes sense."), on any dataset. Group ids: ``<group>/memory`` for ``broadcast`` / ``used`` (every
memory step of a prompt's episodes is compared with the others), ``<group>/memory/<write>`` per ``snapshot`` or
``local`` write.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

from memrl.episode.config import MemoryCreditConfig
from memrl.registry import Registry
from memrl.types import MemoryOpType, MemoryWrite, StepTrajectory


class SampleAt(str, enum.Enum):
    """Which writes the runner samples ``snapshot_k`` alternative replies at (one GRPO group each)."""

    NONE = "none"  # one reply per write
    PLANNED = "planned"  # the writes the snapshot scorer plans (evidence turns first)
    EVERY_WRITE = "every_write"


class ScoredBy(str, enum.Enum):
    """What a write's outcome share is measured by."""

    OUTCOME = "outcome"  # the episode's own answers
    ANSWERING = "answering"  # answering the question on a store copy holding that alternative (snapshot)
    STEP_TERMS = "step_terms"  # nothing beyond the per-step terms (outcome share 0)


@dataclass(frozen=True)
class CreditSpec:
    """What a step credit needs from the episode runner."""

    sample_at: SampleAt = SampleAt.NONE
    scored_by: ScoredBy = ScoredBy.OUTCOME

    def __post_init__(self) -> None:
        object.__setattr__(self, "sample_at", SampleAt(self.sample_at))
        object.__setattr__(self, "scored_by", ScoredBy(self.scored_by))
        if self.scored_by is ScoredBy.ANSWERING and self.sample_at is SampleAt.NONE:
            raise ValueError("CreditSpec: scored_by=answering scores sampled alternatives; set sample_at")

    @property
    def samples_alternatives(self) -> bool:
        return self.sample_at is not SampleAt.NONE


@dataclass(frozen=True)
class CreditInput:
    """``steps``: the episode's memory-write steps in order (snapshot alternatives included); ``outcome``: its
    mean leaf reward; ``used_fact_ids``: the facts the answer's prompt carried."""

    steps: tuple[StepTrajectory, ...]
    outcome: float
    used_fact_ids: frozenset[int]


CreditFn = Callable[[CreditInput], list[float | None]]


@dataclass(frozen=True)
class StepCredit:
    """A registered step credit: its :class:`CreditSpec` and its outcome shares."""

    spec: CreditSpec
    shares: CreditFn


STEP_CREDITS: Registry[StepCredit] = Registry("memory step credit")


def register_credit(name: str, spec: CreditSpec | None = None) -> Callable[[CreditFn], CreditFn]:
    """``@register_credit("mine", CreditSpec(...))`` on a :data:`CreditFn` registers it under ``name``."""

    def deco(fn: CreditFn) -> CreditFn:
        STEP_CREDITS.register(name)(StepCredit(spec or CreditSpec(), fn))
        return fn

    return deco


def get_credit(name: str) -> StepCredit:
    """The registered credit ``name`` (or a dotted path to a :class:`StepCredit`)."""
    entry = STEP_CREDITS.get(name)
    if not isinstance(entry, StepCredit):
        raise TypeError(
            f"episode.memory_credit.name={name!r} is a {type(entry).__name__}, expected a StepCredit "
            "(memrl.episode.credit.StepCredit(spec=CreditSpec(...), shares=fn))"
        )
    return entry


def write_of(step: StepTrajectory) -> MemoryWrite:
    """The :class:`~memrl.types.MemoryWrite` of a memory step (credit only ever sees memory steps)."""
    if step.meta.write is None:
        raise ValueError(f"step {step.step_id!r} is not a memory write (StepMeta.write is None)")
    return step.meta.write


def written_ids(step: StepTrajectory) -> set[int]:
    """Facts a step's applied operations wrote (an UPDATE's new fact included)."""
    return {
        fid
        for op in step.meta.memory_ops
        if op.op in (MemoryOpType.ADD, MemoryOpType.UPDATE)
        for fid in op.fact_ids
    }


@register_credit("broadcast")
def broadcast(inp: CreditInput) -> list[float | None]:
    return [inp.outcome if write_of(s).applied else None for s in inp.steps]


@register_credit("used")
def used(inp: CreditInput) -> list[float | None]:
    out: list[float | None] = []
    for s in inp.steps:
        if not write_of(s).applied:
            out.append(None)
        else:
            out.append(inp.outcome if written_ids(s) & inp.used_fact_ids else 0.0)
    return out


@register_credit("snapshot", CreditSpec(SampleAt.PLANNED, ScoredBy.ANSWERING))
def snapshot(inp: CreditInput) -> list[float | None]:
    return [write_of(s).snapshot_reward for s in inp.steps]


@register_credit("local", CreditSpec(SampleAt.EVERY_WRITE, ScoredBy.STEP_TERMS))
def local(inp: CreditInput) -> list[float | None]:
    return [0.0 for _ in inp.steps]


def step_rewards(inp: CreditInput, cfg: MemoryCreditConfig) -> list[float | None]:
    """The credit function's outcome shares plus the per-step terms (module docstring)."""
    shares = get_credit(cfg.name).shares(inp)
    if len(shares) != len(inp.steps):
        raise RuntimeError(f"step credit {cfg.name!r} gave {len(shares)} rewards for {len(inp.steps)} steps")
    out: list[float | None] = []
    for step, share in zip(inp.steps, shares, strict=True):
        if share is None:
            out.append(None)
            continue
        write = write_of(step)
        reward = float(share) + cfg.format_weight * float(not write.format_errors)
        if write.op_score is not None and cfg.op_weight:
            reward += cfg.op_weight * write.op_score
        if cfg.unsupported_weight and write.unsupported_facts:
            reward -= cfg.unsupported_weight
        out.append(reward)
    return out


def credit_group(group_id: str, write: MemoryWrite) -> str:
    """The GRPO group of a memory step: the ``k`` alternatives of one sampled write form their own group."""
    if write.alternatives > 1:
        return f"{group_id}/memory/{write.index}"
    return f"{group_id}/memory"
