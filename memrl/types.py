"""The frozen contracts every memrl layer speaks.

Token ids are the truth: a trajectory is built by appending token ids (model output with mask 1, tool
results and injected text with mask 0) and is never re-tokenised from text, so training sees exactly what
inference produced.

Every contract validates itself on creation and raises :class:`ContractError` naming the type, the field and
what was expected. Free-form extras live in one sidecar field (``metadata`` / ``extra``), never in ad-hoc dicts
passed between components; what a later stage computes with is a typed field. Their plain-dict form (dumps,
Parquet sidecars, checkpoints) is :mod:`memrl.serialize`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.checks import (
    ContractError,
    as_tuple,
    enum_field,
    fail,
    freeze_mapping,
    optional_number,
    require_count,
    require_str,
)


class TurnRole(str, enum.Enum):
    """History turns only feed memory; the target turn is generated and trained on."""

    HISTORY = "history"
    TARGET = "target"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # eos token, a stop token id or a stop string fired
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # the backend gave up (e.g. context overflow)


class EpisodeStatus(str, enum.Enum):
    """Lifecycle of an episode (as slime's Sample.Status)."""

    PENDING = "pending"
    COMPLETED = "completed"
    TRUNCATED = "truncated"  # ran out of token budget; still trainable
    ABORTED = "aborted"  # stopped from outside (shutdown, actor loss); re-run it
    FAILED = "failed"  # an error inside this episode; carries failure_reason


class ToolStatus(str, enum.Enum):
    """How one tool call ended. A failing call is an observation the model reads, never an exception."""

    OK = "ok"
    ERROR = "error"  # the program raised or exited non-zero, or the call was malformed / named no tool
    TIMEOUT = "timeout"  # killed at the wall-clock limit

    def __str__(self) -> str:  # the value in f-strings and logs on every Python version
        return self.value


class BranchFinish(str, enum.Enum):
    """Why a rollout branch stopped; a leaf's ``StepMeta.finish``. Only ``LENGTH`` makes an episode TRUNCATED."""

    ANSWER = "answer"  # the model closed its answer tag
    EOS = "eos"  # eos / a stop token without an answer
    LENGTH = "length"  # the response budget ran out
    ABORT = "abort"  # the backend gave up (e.g. context overflow)
    TOOL_LIMIT = "tool_limit"  # a turn asked for a call past rollout.max_tool_calls
    RETRY_LIMIT = "retry_limit"  # a failing call was regenerated rollback.max_retries times


class StepRole(str, enum.Enum):
    """The part the policy plays in a trainable step; training splits rows by it (``train.roles``)."""

    ANSWER = "answer"  # a target-turn step
    MEMORY = "memory"  # a memory write the policy generated (``memory.extractor: policy``)


class MemoryOpType(str, enum.Enum):
    ADD = "ADD"
    UPDATE = "UPDATE"
    DELETE = "DELETE"
    NOOP = "NOOP"
    COMPRESS = "COMPRESS"
    RETRIEVE = "RETRIEVE"


@dataclass(frozen=True)
class TurnSpec:
    """One turn of an episode.

    ``turn_id`` is the dataset's own id (LoCoMo dialog id ``D1:3``, LongMemEval ``<session>:<i>``) so that
    retrieved facts can be traced back to gold evidence. ``timestamp`` is the session date as the dataset
    writes it (free text; parsed where needed).
    """

    role: TurnRole
    text: str
    turn_id: str
    speaker: str = ""
    timestamp: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        enum_field(self, "role", TurnRole)
        require_str(self, "turn_id", self.turn_id)
        require_str(self, "text", self.text, non_empty=False)
        require_str(self, "speaker", self.speaker, non_empty=False)
        if self.timestamp is not None:
            require_str(self, "timestamp", self.timestamp, non_empty=False)
        freeze_mapping(self, "metadata", self.metadata)


@dataclass(frozen=True)
class BatchInput:
    """One episode as an adapter produces it: history turns, then exactly one final target turn.

    ``group_id`` ties together the ``n_samples_per_prompt`` copies of one prompt (GRPO groups);
    ``sample_index`` is unique per copy and is set by the data source (``-1`` before sampling).
    ``target_answer`` is ``None`` for questions without a gold answer (e.g. LoCoMo adversarial)."""

    episode_id: str
    group_id: str
    turns: tuple[TurnSpec, ...]
    final_query: str
    target_answer: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    sample_index: int = -1

    def __post_init__(self) -> None:
        require_str(self, "episode_id", self.episode_id)
        require_str(self, "group_id", self.group_id)
        turns = as_tuple(self, "turns", self.turns, TurnSpec)
        if not turns:
            fail(self, "turns", "must contain at least one turn (the target)")
        targets = [i for i, t in enumerate(turns) if t.role is TurnRole.TARGET]
        if targets != [len(turns) - 1]:
            fail(
                self,
                "turns",
                f"exactly one target turn, last; got target positions {targets} of {len(turns)}",
            )
        require_str(self, "final_query", self.final_query)
        if self.target_answer is not None:
            require_str(self, "target_answer", self.target_answer, non_empty=False)
        if not isinstance(self.sample_index, int) or isinstance(self.sample_index, bool):
            fail(self, "sample_index", f"expected int, got {type(self.sample_index).__name__}")
        freeze_mapping(self, "metadata", self.metadata)

    @property
    def history(self) -> tuple[TurnSpec, ...]:
        return self.turns[:-1]

    @property
    def target(self) -> TurnSpec:
        return self.turns[-1]


@dataclass(frozen=True)
class GenerationOutput:
    """What a PolicyClient returns for one sampled continuation.

    ``logprobs[i]`` is the sampled token's log-probability under the sampling distribution's logits
    (temperature applied, before top-p). ``top_logprobs[i]`` maps the k most likely token ids to their
    log-probabilities (empty tuple when top-k logprobs were not requested); tree search derives entropy from it.
    ``stop_reason`` is the stop string or stop token id that fired (``None`` for eos / length).
    ``cached_tokens`` counts prompt tokens served from a prefix cache rather than recomputed.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    top_logprobs: tuple[Mapping[int, float], ...] = ()
    stop_reason: str | int | None = None
    prompt_token_ids: tuple[int, ...] = ()
    cached_tokens: int = 0

    def __post_init__(self) -> None:
        ids = as_tuple(self, "token_ids", self.token_ids, int)
        lps = as_tuple(self, "logprobs", self.logprobs)
        if len(lps) != len(ids):
            fail(self, "logprobs", f"length {len(lps)} != len(token_ids) {len(ids)}")
        for i, lp in enumerate(lps):
            if not isinstance(lp, (int, float)) or math.isnan(lp) or lp > 1e-4:
                fail(self, "logprobs", f"item {i} = {lp!r} is not a log-probability (finite, <= 0)")
        tops = as_tuple(self, "top_logprobs", self.top_logprobs)
        if tops and len(tops) != len(ids):
            fail(self, "top_logprobs", f"length {len(tops)} != len(token_ids) {len(ids)} (or empty)")
        enum_field(self, "finish_reason", FinishReason)
        as_tuple(self, "prompt_token_ids", self.prompt_token_ids, int)
        if self.cached_tokens < 0:
            fail(self, "cached_tokens", "must be >= 0")


@dataclass(frozen=True)
class MemoryOp:
    """One memory operation, logged for the step_meta sidecar (and future step-wise memory rewards)."""

    op: MemoryOpType
    turn_id: str
    fact_ids: tuple[int, ...] = ()
    text: str = ""
    summary_id: int | None = None
    scores: tuple[float, ...] = ()
    source_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        enum_field(self, "op", MemoryOpType)
        require_str(self, "turn_id", self.turn_id)
        as_tuple(self, "fact_ids", self.fact_ids, int)
        as_tuple(self, "scores", self.scores)
        as_tuple(self, "source_ids", self.source_ids, str)
        if self.op is MemoryOpType.COMPRESS and self.summary_id is None:
            fail(self, "summary_id", "a COMPRESS op must carry the summary id it produced")
        if self.op in (MemoryOpType.UPDATE, MemoryOpType.DELETE) and not self.fact_ids:
            fail(self, "fact_ids", f"a {self.op.value} op must name the fact ids it touched")


@dataclass(frozen=True)
class ToolCallRecord:
    """One executed tool call inside a response. ``position`` is the response-token index where the call ends."""

    name: str
    arguments: str
    result: str
    status: ToolStatus
    position: int
    latency_s: float = 0.0
    error: str | None = None

    def __post_init__(self) -> None:
        enum_field(self, "status", ToolStatus)


@dataclass(frozen=True)
class RollbackRecord:
    """A failed tool call that was rolled back: its tokens were removed and the call regenerated.

    ``repaired_tokens``: the corrected turn spliced in at ``position`` (response indices ``[position, position +
    repaired_tokens)``). It was sampled with the error and feedback in context, which the final sequence no longer
    holds, so its sampling-time log-probs are not behaviour log-probs under the final context: the trainer
    recomputes them under the final context (as verl recomputes ``old_log_prob``) and trains the repaired call
    like any other token, i.e. it learns to write the working call directly.
    """

    position: int
    error: str
    attempts: int
    tokens_removed: int
    repaired: bool
    repaired_tokens: int = 0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            fail(self, "attempts", "must be >= 1")
        if self.tokens_removed < 0:
            fail(self, "tokens_removed", "must be >= 0")
        if self.repaired_tokens < 0 or (self.repaired_tokens and not self.repaired):
            fail(self, "repaired_tokens", "must be >= 0, and 0 unless the call was repaired")


@dataclass(frozen=True)
class PathNode:
    """One node on a tree leaf's root-to-leaf path (``StepMeta.tree_path``).

    The node's tokens end at response position ``pos`` (its children continue from there; the root has 0 and
    the leaf the response length). ``entropy`` is the mean normalised entropy of the tokens generated right
    after the node (what the entropy expansion policy ranks; ``None`` where not measured), ``children`` its
    number of children when the tree was finished.
    """

    uid: str
    pos: int
    entropy: float | None = None
    children: int = 0

    def __post_init__(self) -> None:
        require_str(self, "uid", self.uid)
        if not isinstance(self.pos, int) or isinstance(self.pos, bool) or self.pos < 0:
            fail(self, "pos", f"expected a response position (int >= 0), got {self.pos!r}")
        if self.entropy is not None:
            object.__setattr__(self, "entropy", float(self.entropy))


@dataclass(frozen=True)
class MemoryWrite:
    """One policy-written memory step as its credit and its trainer read it (:mod:`memrl.episode.credit`).

    ``index``: the write's position among the episode's writes; the step is reply ``alternative`` of the
    ``alternatives`` replies sampled from one store state (1 unless snapshot / local credit sampled the write).
    ``applied``: this reply changed the episode's own store (reply 0; the others went to store copies).
    ``turns_read``: history turns the episode's writes had read up to and including this one; ``facts_before`` /
    ``facts_after``: current facts around the write (``facts_after``: ``None`` for a reply not applied).
    ``format_errors``: reply lines that were not valid operations. ``op_score``: F1 of the reply's operations
    against the dataset's (:func:`memrl.memory.gold.ops_score`; ``None`` where the dataset does not know them),
    ``gold_ops`` those operations as the writer would write them. ``snapshot_reward``: the outcome of answering
    on the store copy this reply was applied to (snapshot credit; else ``None``). ``turn_kinds``: of each turn
    read; ``facts_written``: the reply's ADD / UPDATE facts, ``unsupported_facts`` those invented
    (:mod:`memrl.memory.faithfulness`)."""

    index: int
    alternative: int = 0
    alternatives: int = 1
    applied: bool = True
    turns_read: int = 1
    facts_before: int = 0
    facts_after: int | None = None
    format_errors: tuple[str, ...] = ()
    op_score: float | None = None
    gold_ops: str | None = None
    snapshot_reward: float | None = None
    turn_kinds: tuple[str, ...] = ()
    facts_written: int = 0
    unsupported_facts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("index", "alternative", "turns_read", "facts_before", "facts_written"):
            require_count(self, name, getattr(self, name))
        require_count(self, "alternatives", self.alternatives, low=1)
        if self.alternative >= self.alternatives:
            fail(self, "alternative", f"{self.alternative} is not below alternatives={self.alternatives}")
        if not isinstance(self.applied, bool):
            fail(self, "applied", f"expected bool, got {type(self.applied).__name__}")
        if self.facts_after is not None:
            require_count(self, "facts_after", self.facts_after)
        for name in ("format_errors", "turn_kinds", "unsupported_facts"):
            as_tuple(self, name, getattr(self, name), str)
        optional_number(self, "op_score", self.op_score, 0.0, 1.0)
        if self.gold_ops is not None:
            require_str(self, "gold_ops", self.gold_ops, non_empty=False)
        optional_number(self, "snapshot_reward", self.snapshot_reward)

    @property
    def op_right(self) -> bool | None:
        """Every operation was the dataset's (``None`` where it does not know them)."""
        return None if self.op_score is None else self.op_score == 1.0


@dataclass(frozen=True)
class StepMeta:
    """Sidecar of one trainable step. Aligned 1:1 with rows of the training batch; never enters the loss.

    Tree search fills the tree fields (``tree_path``: root-to-leaf nodes, read by tree advantages and
    ``memrl inspect``); every rollout ``finish``, ``tool_calls``, ``rollbacks``. The episode runner adds
    ``leaf_index``, ``source_episode_id`` (the input episode; its leaves are trajectories ``<id>#<j>``),
    ``response_text`` (what the reward scored), ``gold_answer`` / ``gold_python``, the prompt's
    ``included_fact_ids`` / ``cut_fact_ids`` and memory fields.

    What training reads is typed: ``role`` (``answer`` on every target step, ``memory`` on a policy-written
    memory step, ``None`` on an untrainable history record), ``credit_group`` (the GRPO group of a memory step;
    answer steps train in their episode's group) and ``write`` (the memory step's :class:`MemoryWrite`).
    ``extra`` holds display-only values (question, evidence, spans, what a writer read): nothing trains on it."""

    turn_id: str = ""
    turn_role: TurnRole = TurnRole.TARGET
    tree_id: str | None = None
    node_path: tuple[int, ...] = ()
    branch_depth: int = 0
    is_duplicate: bool = False
    tree_path: tuple[PathNode, ...] = ()
    finish: BranchFinish | None = None
    tool_calls: tuple[ToolCallRecord, ...] = ()
    rollbacks: tuple[RollbackRecord, ...] = ()
    memory_ops: tuple[MemoryOp, ...] = ()
    retrieved_ids: tuple[int, ...] = ()
    included_fact_ids: tuple[int, ...] = ()
    cut_fact_ids: tuple[int, ...] = ()
    leaf_index: int = 0
    source_episode_id: str = ""
    response_text: str = ""
    gold_answer: str | None = None
    gold_python: str | None = None  # a program printing the gold answer, where the dataset has one
    role: StepRole | None = None
    credit_group: str | None = None
    write: MemoryWrite | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        enum_field(self, "turn_role", TurnRole)
        self._check_role()
        as_tuple(self, "node_path", self.node_path, int)
        as_tuple(self, "tree_path", self.tree_path, PathNode)
        if self.finish is not None:
            enum_field(self, "finish", BranchFinish)
        as_tuple(self, "tool_calls", self.tool_calls, ToolCallRecord)
        as_tuple(self, "rollbacks", self.rollbacks, RollbackRecord)
        as_tuple(self, "memory_ops", self.memory_ops, MemoryOp)
        as_tuple(self, "retrieved_ids", self.retrieved_ids, int)
        as_tuple(self, "included_fact_ids", self.included_fact_ids, int)
        as_tuple(self, "cut_fact_ids", self.cut_fact_ids, int)
        if self.branch_depth < 0:
            fail(self, "branch_depth", "must be >= 0")
        if self.leaf_index < 0:
            fail(self, "leaf_index", "must be >= 0")
        require_str(self, "source_episode_id", self.source_episode_id, non_empty=False)
        require_str(self, "response_text", self.response_text, non_empty=False)
        freeze_mapping(self, "extra", self.extra)

    def _check_role(self) -> None:
        if self.role is None and self.turn_role is TurnRole.TARGET:
            object.__setattr__(self, "role", StepRole.ANSWER)
        if self.role is not None:
            enum_field(self, "role", StepRole)
        want = {StepRole.ANSWER: TurnRole.TARGET, StepRole.MEMORY: TurnRole.HISTORY}.get(self.role)
        if want is not None and self.turn_role is not want:
            why = f"{self.role.value} steps have turn_role {want.value}, got {self.turn_role.value}"
            fail(self, "role", why)
        if self.write is not None and not isinstance(self.write, MemoryWrite):
            fail(self, "write", f"expected MemoryWrite or None, got {type(self.write).__name__}")
        if (self.write is not None) != (self.role is StepRole.MEMORY):
            fail(self, "write", "a memory step carries its MemoryWrite, and only a memory step does")
        if self.credit_group is not None:
            require_str(self, "credit_group", self.credit_group)
            if self.role is not StepRole.MEMORY:
                fail(
                    self, "credit_group", "only memory steps have their own group (answers use the episode's)"
                )


@dataclass(frozen=True)
class StepTrajectory:
    """One trainable sequence: ``prompt_ids`` then ``response_ids``.

    ``response_mask[i]`` is 1 for tokens the policy generated (trained on) and 0 for tool results and injected
    feedback. ``logprobs[i]`` is the behaviour policy's log-prob of ``response_ids[i]`` (0.0 where mask is 0).
    """

    step_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    turn_id: str
    turn_role: TurnRole = TurnRole.TARGET
    meta: StepMeta = field(default_factory=StepMeta)

    def __post_init__(self) -> None:
        require_str(self, "step_id", self.step_id)
        require_str(self, "turn_id", self.turn_id)
        prompt = as_tuple(self, "prompt_ids", self.prompt_ids, int)
        resp = as_tuple(self, "response_ids", self.response_ids, int)
        mask = as_tuple(self, "response_mask", self.response_mask, int)
        lps = as_tuple(self, "logprobs", self.logprobs)
        if not prompt:
            fail(self, "prompt_ids", "must be non-empty")
        if len(mask) != len(resp):
            fail(
                self,
                "response_mask",
                f"length {len(mask)} != len(response_ids) {len(resp)} (step {self.step_id})",
            )
        if len(lps) != len(resp):
            fail(
                self, "logprobs", f"length {len(lps)} != len(response_ids) {len(resp)} (step {self.step_id})"
            )
        bad = [i for i, m in enumerate(mask) if m not in (0, 1)]
        if bad:
            fail(self, "response_mask", f"values must be 0 or 1; position {bad[0]} is {mask[bad[0]]}")
        object.__setattr__(self, "turn_role", TurnRole(self.turn_role))
        if not isinstance(self.meta, StepMeta):
            fail(self, "meta", f"expected StepMeta, got {type(self.meta).__name__}")

    @property
    def trainable(self) -> bool:
        """A target turn, or a memory write the policy generated (history step with model tokens)."""
        return any(self.response_mask)

    @classmethod
    def from_generation(
        cls,
        step_id: str,
        prompt_ids: Sequence[int],
        gen: GenerationOutput,
        turn_id: str,
        meta: StepMeta | None = None,
    ) -> StepTrajectory:
        """A plain (tool-free) generation: every response token is a model token."""
        return cls(
            step_id=step_id,
            prompt_ids=tuple(prompt_ids),
            response_ids=gen.token_ids,
            response_mask=(1,) * len(gen.token_ids),
            logprobs=gen.logprobs,
            turn_id=turn_id,
            meta=meta or StepMeta(turn_id=turn_id),
        )


@dataclass(frozen=True)
class EpisodeTrajectory:
    """A finished episode: its steps, its scalar reward, and how it ended."""

    episode_id: str
    group_id: str
    steps: tuple[StepTrajectory, ...]
    reward: float
    status: EpisodeStatus
    sample_index: int = -1
    failure_reason: str | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    step_rewards_ext: tuple[float | None, ...] = ()

    def __post_init__(self) -> None:
        require_str(self, "episode_id", self.episode_id)
        require_str(self, "group_id", self.group_id)
        as_tuple(self, "steps", self.steps, StepTrajectory)
        enum_field(self, "status", EpisodeStatus)
        if not isinstance(self.reward, (int, float)) or math.isnan(self.reward):
            fail(self, "reward", f"expected a finite float, got {self.reward!r}")
        if self.status is EpisodeStatus.FAILED and not self.failure_reason:
            fail(self, "failure_reason", "a FAILED episode must say why")
        ext = as_tuple(self, "step_rewards_ext", self.step_rewards_ext)
        if ext and len(ext) != len(self.steps):
            fail(self, "step_rewards_ext", f"length {len(ext)} != number of steps {len(self.steps)}")
        freeze_mapping(self, "metrics", self.metrics)

    @property
    def source_episode_id(self) -> str:
        """The input episode this trajectory came from (several leaves of one input share it)."""
        src = self.steps[-1].meta.source_episode_id if self.steps else ""
        return src or self.episode_id


@dataclass
class PackedBatch:
    """Training tensors for a list of steps, named as verl names them, plus sidecars.

    Layout ``padded``: every tensor is ``[num_steps, L]`` with ``L = max_prompt + max_response``; prompts are
    left-padded and responses right-padded (as verl), ``responses``/``response_mask``/``token_level_rewards``/
    ``old_log_probs`` are ``[num_steps, max_response]``.
    Layout ``packed``: ``input_ids``/``position_ids``/``attention_mask`` are ``[1, total_tokens]`` with no
    padding, ``cu_seqlens`` is ``[num_steps + 1]`` (int32) and position ids restart at 0 for each sequence;
    response-side tensors are ``[1, total_tokens]`` aligned with ``input_ids`` (0 on prompt tokens).
    ``prompt_lengths``/``response_lengths`` are ``[num_steps]``. Sidecars (``step_meta``, ``step_rewards_ext``,
    ``group_ids``, ``episode_ids``, ``step_ids``) are lists aligned 1:1 with steps; they never enter the loss.
    Mutable on purpose: tensors get moved between devices.
    """

    layout: str
    input_ids: Any
    attention_mask: Any
    position_ids: Any
    responses: Any
    response_mask: Any
    token_level_rewards: Any
    old_log_probs: Any
    prompt_lengths: Any
    response_lengths: Any
    rewards: Any
    group_ids: list[str]
    episode_ids: list[str]
    step_ids: list[str]
    step_meta: list[StepMeta]
    step_rewards_ext: list[float | None]
    cu_seqlens: Any = None
    # Additive: ``prompts`` is verl's left-padded ``[num_steps, max_prompt]`` prompt
    # block (padded layout only, None when packed); ``truncated`` is ``[num_steps]`` bool, True where the
    # builder cut a prompt/response to its length limit or the episode itself ended TRUNCATED.
    prompts: Any = None
    truncated: Any = None

    def __post_init__(self) -> None:
        if self.layout not in ("padded", "packed"):
            fail(self, "layout", f"expected 'padded' or 'packed', got {self.layout!r}")
        n = len(self.step_ids)
        for name in ("group_ids", "episode_ids", "step_meta", "step_rewards_ext"):
            if len(getattr(self, name)) != n:
                fail(self, name, f"length {len(getattr(self, name))} != number of steps {n}")
        if self.layout == "packed" and self.cu_seqlens is None:
            fail(self, "cu_seqlens", "the packed layout needs cu_seqlens")

    @property
    def num_steps(self) -> int:
        return len(self.step_ids)


__all__ = [
    "BatchInput",
    "BranchFinish",
    "ContractError",
    "EpisodeStatus",
    "EpisodeTrajectory",
    "FinishReason",
    "GenerationOutput",
    "MemoryOp",
    "MemoryOpType",
    "MemoryWrite",
    "PackedBatch",
    "PathNode",
    "RollbackRecord",
    "StepMeta",
    "StepRole",
    "StepTrajectory",
    "ToolCallRecord",
    "ToolStatus",
    "TurnRole",
    "TurnSpec",
]
