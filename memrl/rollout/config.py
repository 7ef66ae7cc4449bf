from __future__ import annotations

from dataclasses import dataclass, field


def _default_rollback_errors() -> list[str]:
    # Errors a model can fix by rewriting its call (not runtime data errors).
    return [
        "ImportError",
        "ModuleNotFoundError",
        "SyntaxError",
        "IndentationError",
        "NameError",
        "tool call format is wrong",
    ]


@dataclass
class TreeConfig:
    """Offline tree search: build trees, grow ``initial_rollouts`` chains per prompt, then
    ``expansion_iterations`` rounds that each pick ``nodes_per_expansion`` nodes per tree (by
    ``expansion_policy``) and give each ``beam_size - 1`` new branches, so an expanded node ends up with
    ``beam_size`` continuations. Leaves per tree =
    ``initial_rollouts + expansion_iterations * nodes_per_expansion * (beam_size - 1)``.

    Nodes sit between generation segments of at most ``segment_tokens`` model tokens (and after tool results);
    ``entropy`` ranks a node by the mean entropy of the first tokens generated after it
    (:data:`memrl.rollout.expansion.ENTROPY_WINDOW`).
    Branches generate to their stop in one call: the segment nodes are laid out once a branch has finished, and a
    fork continues from the owner's final state cropped to the node (one generate call and one kept KV state per
    branch, instead of one per segment). Segment nodes are the only branch points: forks at any sampled token
    (TreeRL-style) saved few tokens and cost more on the task trained on (docs/experiments.md).

    Each tree starts its next round as soon as its own branches have all ended, and the new forks join the rows
    still decoding (one generation stream, :mod:`memrl.policy.stream`), so no tree waits for another tree's
    slowest branch (fewer sequential decode steps than stepping every tree's round together).

    ``expansion_policy`` is ``random`` (the default) or ``entropy`` (branch where entropy is high; where the
    backend returns no top-k log-probs, the sampled tokens' surprisal stands in for it) or ``tool_call`` (branch
    right after a tool call's opening tag, so siblings share the prefix and differ in the program; random nodes
    in a tree that made no call) or a dotted path. Random is the default because it measured at least as good as
    entropy: the answer is written early while entropy peaks in the rambling tail, so entropy forks rarely change
    the answer (docs/benchmarks.md, rollout).
    Only response positions are branch points (a fork at the bare prompt would just be another chain); the
    root is used only when a tree has no other candidate.
    """

    initial_rollouts: int = 2
    expansion_iterations: int = 1
    nodes_per_expansion: int = 1
    beam_size: int = 3
    expansion_policy: str = "random"
    segment_tokens: int = 32

    def __post_init__(self) -> None:
        checks = (
            ("initial_rollouts", self.initial_rollouts, 1),
            ("expansion_iterations", self.expansion_iterations, 0),
            ("nodes_per_expansion", self.nodes_per_expansion, 1),
            ("beam_size", self.beam_size, 2),
            ("segment_tokens", self.segment_tokens, 1),
        )
        for name, value, low in checks:
            if value < low:
                hint = " (beam_size 2 adds one branch per expanded node)" if name == "beam_size" else ""
                raise ValueError(f"rollout.tree.{name} must be >= {low}, got {value}{hint}")

    def leaves_per_tree(self) -> int:
        return self.initial_rollouts + self.expansion_iterations * self.nodes_per_expansion * (
            self.beam_size - 1
        )


@dataclass
class RollbackConfig:
    """Tool-call rollback. When a tool result's error matches one of ``rollback_on_errors``
    (substring match), the error is fed back, the model regenerates its call, and the context is restored to
    the checkpoint taken before the failed call so only the corrected call stays. ``max_tool_retries``
    bounds regenerations per call position; past it the branch is TERMINATED. ``feedback_template`` is the
    text (mask 0, later removed) appended after the error result; ``{error}`` is replaced by the error."""

    enable_tool_rollback: bool = False
    max_tool_retries: int = 3
    rollback_on_errors: list[str] = field(default_factory=_default_rollback_errors)
    feedback_template: str = "\nThe tool call failed with: {error}\nWrite a corrected call.\n"

    def __post_init__(self) -> None:
        if self.max_tool_retries < 0:
            raise ValueError(f"rollout.rollback.max_tool_retries must be >= 0, got {self.max_tool_retries}")
        if self.enable_tool_rollback and not self.rollback_on_errors:
            raise ValueError(
                "rollout.rollback.rollback_on_errors is empty while enable_tool_rollback=true: nothing would"
                " ever roll back; list error substrings (e.g. 'SyntaxError') or disable rollback"
            )
        if "{error}" not in self.feedback_template:
            raise ValueError("rollout.rollback.feedback_template must contain '{error}'")


@dataclass
class RolloutConfig:
    """Target-turn generation strategy (owned by memrl.rollout).

    ``strategy``: ``chain`` (``n`` independent samples) or ``tree`` (offline tree search), or a dotted path.
    ``n`` leaves are returned per request. ``max_response_tokens`` bounds every leaf's response (model tokens
    plus tool results); ``max_tool_calls`` bounds calls per leaf (a further call terminates the branch).
    Generation ends when ``</answer>`` closes (nothing after the answer is scored). ``tool_parser`` names the tools layer's
    call parser. ``seed`` derives the per-request sampling seeds (reproducible runs).
    """

    strategy: str = "chain"
    n: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    top_logprobs: int = 5
    max_response_tokens: int = 256
    max_tool_calls: int = 4
    tool_parser: str = "tag"
    seed: int = 0
    tree: TreeConfig = field(default_factory=TreeConfig)
    rollback: RollbackConfig = field(default_factory=RollbackConfig)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"rollout.n must be >= 1 (leaves per prompt), got {self.n}")
        if self.max_response_tokens < 1:
            raise ValueError(f"rollout.max_response_tokens must be >= 1, got {self.max_response_tokens}")
        if self.max_tool_calls < 0:
            raise ValueError(f"rollout.max_tool_calls must be >= 0, got {self.max_tool_calls}")
        if self.temperature < 0:
            raise ValueError(f"rollout.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout.top_p must be in (0, 1], got {self.top_p}")
        if self.top_logprobs < 0:
            raise ValueError(f"rollout.top_logprobs must be >= 0, got {self.top_logprobs}")
