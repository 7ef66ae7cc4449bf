"""One state object per branch (a chain, or a path through a tree from its fork point to a leaf).

Token ids are the truth: ``tokens`` is prompt + response; ``mask``/``logprobs`` are aligned with the response
(1 and the behaviour log-prob for model tokens, 0 and 0.0 for tool results and feedback). Rollback snapshots
*lengths* and truncates this same object; nothing is re-tokenised.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from memrl.rollout.base import AgentState, RolloutRequest
from memrl.tools.base import ToolCall
from memrl.types import BranchFinish, PathNode, RollbackRecord, StepMeta, StepTrajectory, ToolCallRecord


@dataclass
class OpenRollback:
    """Rollbacks at one call position that are not settled yet (the corrected call has not run)."""

    position: int
    error: str
    attempts: int = 0
    tokens_removed: int = 0

    def close(self, repaired: bool, end: int | None = None) -> RollbackRecord:
        """Settle the rollback; ``end`` is the response index where the repaired turn ends (when repaired)."""
        return RollbackRecord(
            position=self.position,
            error=self.error,
            attempts=max(1, self.attempts),
            tokens_removed=self.tokens_removed,
            repaired=repaired,
            repaired_tokens=max(0, end - self.position) if repaired and end is not None else 0,
        )


@dataclass
class Branch:
    """Mutable generation state of one branch; see :class:`memrl.rollout.base.AgentState` for ``state``.

    ``floor`` is the response length at the fork point: tokens below it are shared with other branches of the
    tree (the branch's copy of them is private, so a rollback may cut below it; the tree strategy then re-attaches
    the branch higher up). ``turn_start`` is the response index where the current model turn began (after the
    last tool result): the rollback checkpoint.
    """

    uid: str
    request_index: int
    request: RolloutRequest
    tokens: list[int]
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    state: AgentState = AgentState.PENDING
    floor: int = 0
    turn_start: int = 0
    n_calls: int = 0
    segments: int = 0
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    rollbacks: list[RollbackRecord] = field(default_factory=list)
    retries: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    open_rollback: OpenRollback | None = None
    regenerating: bool = (
        False  # the next output is a regenerated call, spliced at the open rollback's position
    )
    pending_calls: list[ToolCall] = field(default_factory=list)
    kept_results: list[tuple[ToolCall, Any]] = field(
        default_factory=list
    )  # (call, ToolResult) before calls_from
    calls_from: int = 0
    finish: BranchFinish | None = None
    spawn_key: str | None = None  # branches sharing it start from one state: one request with n samples
    tree: Any = None  # strategy-owned bookkeeping (tree node links)

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def response_len(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def checkpoint(self) -> int:
        """Response index the open rollback restores to (the turn start when none is open)."""
        return self.open_rollback.position if self.open_rollback is not None else self.turn_start

    def append_model(self, ids: tuple[int, ...], logprobs: tuple[float, ...]) -> None:
        self.tokens.extend(ids)
        self.mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)

    def append_observation(self, ids: list[int]) -> None:
        self.tokens.extend(ids)
        self.mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))

    def truncate(self, response_len: int) -> int:
        """Cut the response back to ``response_len`` tokens; returns how many tokens were removed."""
        removed = self.response_len - response_len
        del self.tokens[self.prompt_len + response_len :]
        del self.mask[response_len:]
        del self.logprobs[response_len:]
        return removed

    def fork(self, uid: str, response_len: int, turn_start: int, spawn_key: str) -> Branch:
        """A new branch sharing this branch's first ``response_len`` response tokens (its fork point)."""
        return Branch(
            uid=uid,
            request_index=self.request_index,
            request=self.request,
            tokens=self.tokens[: self.prompt_len + response_len],
            mask=self.mask[:response_len],
            logprobs=self.logprobs[:response_len],
            state=AgentState.PENDING,
            floor=response_len,
            turn_start=turn_start,
            calls_from=turn_start,
            n_calls=sum(1 for r in self.tool_calls if r.position <= response_len),
            tool_calls=[r for r in self.tool_calls if r.position <= response_len],
            rollbacks=[r for r in self.rollbacks if r.position < response_len],
            retries=defaultdict(int, {p: c for p, c in self.retries.items() if p < response_len}),
            spawn_key=spawn_key,
        )

    def to_step(
        self,
        step_id: str,
        *,
        tree_id: str | None = None,
        node_path: tuple[int, ...] = (),
        branch_depth: int = 0,
        is_duplicate: bool = False,
        tree_path: tuple[PathNode, ...] = (),
    ) -> StepTrajectory:
        """The leaf as a trainable step: how it finished, its tool calls and rollbacks, and where it sits in its
        tree (``extra["branch_uid"]`` names the branch, for debugging)."""
        meta = StepMeta(
            turn_id=self.request.turn_id,
            tree_id=tree_id,
            node_path=node_path,
            branch_depth=branch_depth,
            is_duplicate=is_duplicate,
            tree_path=tree_path,
            finish=self.finish,
            tool_calls=tuple(self.tool_calls),
            rollbacks=tuple(self.rollbacks),
            extra={"branch_uid": self.uid},
        )
        return StepTrajectory(
            step_id=step_id,
            prompt_ids=tuple(self.request.prompt_ids),
            response_ids=tuple(self.tokens[self.prompt_len :]),
            response_mask=tuple(self.mask),
            logprobs=tuple(self.logprobs),
            turn_id=self.request.turn_id,
            meta=meta,
        )
