from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memrl.episode.context_modes import context_mode


@dataclass
class WorkerConfig:
    """Where episodes run: in-process, or sharded over ``num_workers`` Ray actors (each holds a policy backend).

    ``ray_address`` = ``None`` starts a local Ray instance; ``"auto"`` or ``"ray://host:10001"`` joins a cluster.
    ``max_attempts`` bounds how often one shard is re-run after its actor died before the batch gives up.
    """

    use_ray: bool = False
    num_workers: int = 2
    ray_address: str | None = None
    num_cpus_per_worker: float = 1.0
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"episode.worker.num_workers must be >= 1, got {self.num_workers}")
        if self.max_attempts < 1:
            raise ValueError(f"episode.worker.max_attempts must be >= 1, got {self.max_attempts}")
        if self.num_cpus_per_worker <= 0:
            raise ValueError(
                f"episode.worker.num_cpus_per_worker must be > 0, got {self.num_cpus_per_worker}"
                " (use a fraction such as 0.5 to pack several actors per core)"
            )


SNAPSHOT_SCORES = ("answer", "gold_logprob")  # MemoryCreditConfig.snapshot_score
SNAPSHOT_QUESTIONS = ("own", "all")  # MemoryCreditConfig.snapshot_questions


@dataclass
class MemoryCreditConfig:
    """Step credit of policy-written memory (``memory.extractor: policy``; :mod:`memrl.episode.credit`).

    ``name``: ``broadcast`` | ``used`` | ``snapshot`` | ``local``. The per-step terms: ``format_weight`` (every line
    a valid operation), ``op_weight`` (times the F1 of the operations against the dataset's gold ones, where it
    has them; 0 = outcome only), ``unsupported_weight`` (subtracted from a write that wrote a fact the turns it
    read do not support, :mod:`memrl.memory.faithfulness`; 0 = off). ``snapshot_k``
    alternatives are sampled at up to ``snapshot_writes`` writes per episode (those that read an evidence turn
    first; per history under ``snapshot_questions: all``, whose episodes share one trunk) for ``snapshot``, at
    every write for ``local``. ``snapshot_score``: what each snapshot alternative's
    outcome is, ``answer`` (the reward of one greedy answer) or ``gold_logprob`` (how likely the answer policy finds
    the gold answer: the geometric mean of its per-token probabilities, in [0, 1]). A greedy answer rarely changes
    when one write among hundreds does, so ``answer`` groups often tie; the gold answer's likelihood moves with
    every fact that enters or leaves the prompt. ``snapshot_questions``: which questions a fork is scored on,
    ``own`` (its episode's) or ``all`` (every question of the batch asked over the same history, the outcome
    their mean): ``all`` also charges a written fact for what it pushes out of the other questions' prompts.
    """

    name: str = "used"
    format_weight: float = 0.2
    op_weight: float = 0.5
    unsupported_weight: float = 0.0
    snapshot_k: int = 4
    snapshot_writes: int = 2
    snapshot_score: str = "answer"
    snapshot_questions: str = "own"

    def __post_init__(self) -> None:
        if self.snapshot_questions not in SNAPSHOT_QUESTIONS:
            raise ValueError(
                f"episode.memory_credit.snapshot_questions must be one of {list(SNAPSHOT_QUESTIONS)}, "
                f"got {self.snapshot_questions!r}"
            )
        if self.snapshot_score not in SNAPSHOT_SCORES:
            raise ValueError(
                f"episode.memory_credit.snapshot_score must be one of {list(SNAPSHOT_SCORES)}, "
                f"got {self.snapshot_score!r}"
            )
        if self.snapshot_k < 2:
            raise ValueError(
                f"episode.memory_credit.snapshot_k must be >= 2 (a group), got {self.snapshot_k}"
            )
        if self.name == "local" and not (self.format_weight or self.op_weight or self.unsupported_weight):
            raise ValueError(
                "episode.memory_credit.name=local scores each write by its per-step terms alone, and "
                "format_weight, op_weight and unsupported_weight are all 0: every write would score 0"
            )
        if self.unsupported_weight < 0:
            raise ValueError(
                "episode.memory_credit.unsupported_weight is a penalty, subtracted: give it >= 0, got "
                f"{self.unsupported_weight}"
            )
        if self.snapshot_writes < 1:
            raise ValueError(
                f"episode.memory_credit.snapshot_writes must be >= 1, got {self.snapshot_writes}"
            )


@dataclass
class EpisodeConfig:
    """Prompting, reward and rollout workers (owned by memrl.episode).

    ``prompt_template`` is a file name in the bundled ``memrl/prompts/`` directory or a path to a Jinja file.
    ``tool_example``: the tool line of the bundled template shows one worked python call (call, injected result,
    answer) when the python tool is on, as the answer line shows one answer; off, a small policy that was never shown
    a call does not make one.
    ``prompt_token_budget`` bounds the target-turn prompt; over budget the lowest-scored facts are cut (and
    recorded in ``StepMeta.cut_fact_ids``), never the question.
    Retrieved facts are rendered oldest first: the latest value of an attribute comes last, what a capable LLM
    reasons over best.
    ``context`` is what the target-turn prompt carries: ``memory`` (retrieved facts + summary), ``none`` (the
    question alone: the no-memory ablation) or ``recent_history`` (the most recent raw history turns, rendered
    like facts, oldest first, as many as fit ``policy.max_model_len`` minus ``rollout.max_response_tokens`` and a
    reserve for the question, in place of ``prompt_token_budget``: the "full context" baseline cut to the model's
    window; the slice does not depend on the question, so every question about one history gets the same system
    message and the HF backend prefills it once per batch; raise ``batch_size`` up to ``policy.max_batch_size``
    so more of a conversation's questions share it). ``none`` and ``recent_history`` build no memory, so no tool
    can read it either.
    ``batch_size`` is how many episodes advance together through the state machine (memory ops and
    generation are batched across them). ``ingest_chunk_turns`` history turns per episode go into one batched
    extraction call (0 = the whole history at once; use 1 with the ``llm`` extractor so each turn is decided
    against the memory the previous turns built). ``record_history_turns``: emit one untrainable step per
    history turn carrying its memory ops (for step-wise memory rewards); off, leaf 0 holds only its memory writes
    and target steps (for long histories such as LoCoMo's). ``eval_metrics`` are scored by ``memrl eval`` besides
    ``reward``; ``eval_ablations`` lists the variants it runs (``memory``, ``no_memory``,
    ``full_context``: ``context`` = ``memory``, ``none``, ``recent_history``).
    """

    reward: str = "exact_match"
    reward_options: dict[str, Any] = field(default_factory=dict)
    prompt_template: str = "target_turn.j2"
    prompt_token_budget: int = 1536
    tool_example: bool = False
    context: str = "memory"
    use_summary: bool = True
    batch_size: int = 16
    ingest_chunk_turns: int = 0
    record_history_turns: bool = True
    eval_metrics: list[str] = field(default_factory=lambda: ["exact_match", "token_f1"])
    eval_ablations: list[str] = field(default_factory=lambda: ["memory", "no_memory"])
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    memory_credit: MemoryCreditConfig = field(default_factory=MemoryCreditConfig)

    def __post_init__(self) -> None:
        if self.prompt_token_budget < 16:
            raise ValueError(
                f"episode.prompt_token_budget must be >= 16 tokens, got {self.prompt_token_budget}"
                " (it must at least hold the instructions and the question)"
            )
        try:
            context_mode(self.context)  # the modes: memrl.episode.context_modes
        except (KeyError, TypeError) as exc:
            raise ValueError(f"episode.context: {exc}") from exc
        if not isinstance(self.record_history_turns, bool):
            raise ValueError(
                f"episode.record_history_turns must be true or false, got {self.record_history_turns!r}"
            )
        if self.ingest_chunk_turns < 0:
            raise ValueError(
                f"episode.ingest_chunk_turns must be >= 0 (0 = all at once), got {self.ingest_chunk_turns}"
            )
        if self.batch_size < 1:
            raise ValueError(f"episode.batch_size must be >= 1, got {self.batch_size}")
