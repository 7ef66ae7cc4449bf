"""Per-episode state for the :class:`~memrl.episode.runner.EpisodeRunner` state machine.

One :class:`EpisodeState` per episode; the runner moves every state of a batch through the phases together::

    PENDING → INGESTING → PROMPTING → GENERATING → UPDATING → SCORING → DONE
                   └────────── any phase ──────────→ DONE (status FAILED, failure_reason set)

A failure is local to its state: the runner isolates the episode that broke a batched call and carries on
with the rest.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from memrl.types import BatchInput, EpisodeStatus, MemoryOp, StepTrajectory


class Phase(str, enum.Enum):
    PENDING = "pending"
    INGESTING = "ingesting"  # history turns → memory (facts + summary); no generation
    PROMPTING = "prompting"  # retrieve facts, render the target-turn prompt
    GENERATING = "generating"  # rollout strategy (chain / tree) with tools
    UPDATING = "updating"  # the answer goes back into memory
    SCORING = "scoring"  # reward per leaf
    DONE = "done"


@dataclass
class EpisodeState:
    """Everything one episode accumulates on its way through the phases."""

    inp: BatchInput
    manager: Any = None  # memrl.memory.MemoryManager
    phase: Phase = Phase.PENDING
    cursor: int = 0  # next history turn to ingest
    history_ops: dict[str, list[MemoryOp]] = field(default_factory=dict)  # turn_id → ops it produced
    summary_ops: list[MemoryOp] = field(default_factory=list)
    # memory.extractor=policy: one WriteResult per write, the writes sampled as snapshot groups (by write index)
    # and each alternative's outcome there
    writes: list[Any] = field(default_factory=list)
    snapshot_writes: set[int] = field(default_factory=set)
    snapshot_rewards: dict[int, list[float]] = field(default_factory=dict)
    retrieve_ops: list[MemoryOp] = field(default_factory=list)
    update_ops: list[MemoryOp] = field(default_factory=list)
    retrieved: list[Any] = field(default_factory=list)  # RetrievedFact, oldest first
    prompt: Any = None  # memrl.episode.prompt.BuiltPrompt
    leaves: list[StepTrajectory] = field(default_factory=list)
    responses: list[str] = field(default_factory=list)  # decoded leaf responses (tool segments included)
    rewards: list[float] = field(default_factory=list)
    status: EpisodeStatus = EpisodeStatus.PENDING
    failure_reason: str | None = None
    metrics: dict[str, float] = field(
        default_factory=dict
    )  # into the target step's extra and trajectory metrics

    @property
    def episode_id(self) -> str:
        return self.inp.episode_id

    @property
    def alive(self) -> bool:
        return self.phase is not Phase.DONE

    def advance(self, to: Phase) -> None:
        if self.alive:
            self.phase = to

    def fail(self, phase: Phase, exc: BaseException | str) -> None:
        why = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.failure_reason = f"{phase.value}: {why}"
        self.status = EpisodeStatus.FAILED
        self.phase = Phase.DONE
