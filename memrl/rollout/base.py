"""Rollout API: requests in, ``n`` leaf trajectories per request out.

    from memrl.rollout import RolloutRequest, run_rollout
    result = run_rollout([RolloutRequest(prompt_ids, "ep0")], policy, tools, cfg.rollout)
    result.leaves[0]       # list of cfg.n StepTrajectory for request 0
    result.metrics         # {"rollout/tree/leaves": ..., "tools/rollbacks": ..., ...}

A strategy (registry :data:`STRATEGIES`, ``chain`` | ``tree`` | dotted path) has the signature
``strategy(requests, policy, tools, cfg) -> RolloutLeaves``. Strategies batch across all requests: each
iteration of their loop is one ``policy.generate`` call covering every active branch of every request, and one
``tools.execute`` call covering every pending tool call.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from memrl.policy.base import PolicyClient
from memrl.registry import Registry
from memrl.rollout.config import RolloutConfig
from memrl.tools.base import ToolCall, ToolResult
from memrl.types import ContractError, StepTrajectory


class AgentState(str, enum.Enum):
    """Lifecycle of one branch (as verl's AgentState)."""

    PENDING = "pending"  # created, not yet sent to the policy
    GENERATING = "generating"  # waits for (or is in) the next generate call
    PROCESSING_TOOLS = "processing_tools"  # its last output ended in a tool call that has not run yet
    TERMINATED = "terminated"  # finished: eos / answer / budget / tool limit / retry limit


@dataclass(frozen=True)
class RolloutRequest:
    """One prompt to sample ``cfg.n`` leaves for. ``request_id`` names the episode (it prefixes step ids and
    tree ids); ``tool_context`` is handed to every tool call of this request (e.g. the episode's memory)."""

    prompt_ids: tuple[int, ...]
    request_id: str
    turn_id: str = "target"
    tool_context: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        if not self.prompt_ids:
            raise ContractError(f"RolloutRequest.prompt_ids: must be non-empty (request {self.request_id!r})")
        if not isinstance(self.request_id, str) or not self.request_id.strip():
            raise ContractError("RolloutRequest.request_id: must be a non-empty string")
        if not isinstance(self.turn_id, str) or not self.turn_id.strip():
            raise ContractError(
                f"RolloutRequest.turn_id: must be a non-empty string (request {self.request_id!r})"
            )


@dataclass
class RolloutLeaves:
    """``leaves[i]`` holds exactly ``cfg.n`` trajectories for ``requests[i]`` (duplicates flagged in
    ``StepMeta.is_duplicate``). ``metrics`` are namespaced floats (``rollout/...``, ``tools/...``)."""

    leaves: list[list[StepTrajectory]]
    metrics: dict[str, float] = field(default_factory=dict)


class ToolRunner(Protocol):
    """What a rollout needs from the tools layer (``memrl.tools.ToolExecutor``): run calls in parallel, each
    failure returned as an observation (``status`` ``error``/``timeout``), never raised."""

    def execute(self, calls: Sequence[tuple[ToolCall, Any]]) -> list[ToolResult]: ...

    def record_rollback(self, tool: str) -> None:
        """Counted once per rollback (a failed call of ``tool`` regenerated): ``tools/<tool>/rollbacks``."""
        ...


RolloutStrategy = Callable[
    [Sequence[RolloutRequest], PolicyClient, "ToolRunner | None", RolloutConfig], RolloutLeaves
]

STRATEGY_MODULES = ("memrl.rollout.chain", "memrl.rollout.tree")


def _populate() -> None:
    for name in STRATEGY_MODULES:
        importlib.import_module(name)


STRATEGIES: Registry[RolloutStrategy] = Registry("rollout strategy", populate=_populate)


def run_rollout(
    requests: Sequence[RolloutRequest],
    policy: PolicyClient,
    tools: ToolRunner | None,
    cfg: RolloutConfig,
) -> RolloutLeaves:
    """Sample ``cfg.n`` leaves per request with ``cfg.strategy``."""
    result = STRATEGIES.get(cfg.strategy)(list(requests), policy, tools, cfg)
    if len(result.leaves) != len(requests):
        raise ContractError(
            f"rollout strategy {cfg.strategy!r} returned leaves for {len(result.leaves)} requests,"
            f" expected {len(requests)}"
        )
    for req, leaves in zip(requests, result.leaves, strict=True):
        if len(leaves) != cfg.n:
            raise ContractError(
                f"rollout strategy {cfg.strategy!r} returned {len(leaves)} leaves for request"
                f" {req.request_id!r}, expected rollout.n={cfg.n}"
            )
    return result
