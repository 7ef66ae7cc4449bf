"""LoRA GRPO training config (owned by :mod:`memrl.train`). Names follow verl where verl has one."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class LoraConfig:
    """PEFT LoRA adapter. ``target_modules`` is a list of module names or ``["all-linear"]`` (PEFT's shortcut
    for every linear layer except the output head)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])

    def __post_init__(self) -> None:
        if self.r < 1:
            raise ValueError(f"train.lora.r must be >= 1, got {self.r}")
        if self.alpha <= 0:
            raise ValueError(f"train.lora.alpha must be > 0, got {self.alpha} (a common choice is 2 * r)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"train.lora.dropout must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ValueError(
                "train.lora.target_modules is empty; use ['all-linear'] or e.g. ['q_proj', 'v_proj']"
            )


KL_REFERENCES = ("base", "warm_start", "start")
ROLES = ("answer", "memory")  # target-turn steps; memory writes (memory.extractor: policy)
ROLE_SCHEDULES = ("joint", "alternate")
ROLE_ADAPTERS = ("shared", "per_role")

# Where the SFT target of a replayed group with no good trajectory comes from.
DEMONSTRATION_SOURCES = ("none", "gold", "gold_program")


@dataclass
class ReplayConfig:
    """Replay buffer of finished episodes: joint SFT (best trajectory per group) + RFT
    (reward-weighted log-prob) on samples drawn from it, added to the GRPO loss of the fresh batch.

    ``capacity`` counts episodes (oldest evicted first). ``batch_size`` episodes are sampled per update;
    ``0`` disables replay. ``min_reward`` is the reward a group's best trajectory needs to be an SFT target.
    ``demonstrations`` decides the SFT target of a group with no such trajectory: ``none`` (no SFT target) or
    ``gold`` (the group's prompt followed by ``<answer>gold</answer><eos>``, an off-policy expert trace that
    teaches the answer format a policy never samples; see :mod:`memrl.train.demonstrations`) or ``gold_program``
    (as ``gold``, but a question whose dataset holds a program printing its answer is demonstrated as a python call
    of it, its injected result (mask 0) and the tagged answer: needs ``python`` in ``tools.enabled``).
    """

    capacity: int = 512
    batch_size: int = 0
    sft_weight: float = 0.1
    rft_weight: float = 0.0
    min_reward: float = 0.5
    demonstrations: str = "none"
    # With demonstrations=gold: also imitate the gold operations of memory writes where the dataset knows them
    # (memory.extractor: policy; memrl.memory.gold). false = the memory writer learns from its credit alone.
    memory_demonstrations: bool = True

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"train.replay.capacity must be >= 1, got {self.capacity}")
        if self.batch_size < 0:
            raise ValueError(
                f"train.replay.batch_size must be >= 0 (0 disables replay), got {self.batch_size}"
            )
        if self.sft_weight < 0 or self.rft_weight < 0:
            raise ValueError("train.replay.sft_weight and rft_weight must be >= 0 (0 switches that term off)")
        if self.demonstrations not in DEMONSTRATION_SOURCES:
            raise ValueError(
                f"train.replay.demonstrations must be one of {', '.join(map(repr, DEMONSTRATION_SOURCES))},"
                f" got {self.demonstrations!r} ('gold' trains groups that found no right answer on the gold one)"
            )


WARM_START_ROLES = ("memory", "answer")


@dataclass
class WarmStartConfig:
    """Imitation warm start (:mod:`memrl.train.warm_start`): before the first RL step, SFT on the gold replies of
    the first ``episodes`` training episodes (0 = off), ``batch_size`` replies per optimizer step, ``epochs``
    passes. ``role`` is what it imitates: ``memory``, the gold memory writes (needs gold operations in the data:
    the synthetic task has them); ``answer``, the gold answer of each target turn, demonstrated as
    ``train.replay.demonstrations`` demonstrates it, on the prompt the episode's own ingested memory gives
    (:mod:`memrl.train.warm_start_answer`). The check and ``balance_ops`` are the writer's.

    ``balance_ops``: weight each write by ``1/sqrt`` of how many writes make its decision (ADD, UPDATE, NOOP, …),
    normalised to mean 1, so the rare UPDATE is not drowned out by the majority decision.

    ``check_episodes``: the training episodes after the imitated ones, written greedily by the warm-started writer
    and scored against their gold operations (``warm_start/check_*`` metrics; 0 = no check). A gold decision whose
    recall there is below ``min_recall`` gets a class-balanced pass (each decision as many writes as the rarest
    has), then the check again, at most :data:`~memrl.train.warm_start.BALANCED_PASSES` times; the writer keeps
    the checked state with the best lowest recall. A writer that learned no UPDATE is so caught on episodes it did
    not imitate, not on the test split.

    ``loss_agg``: how the SFT loss averages token log-probs. ``seq-mean-token-mean`` (default) averages each
    write's tokens, then the writes: fine while replies are short and alike. Where they are not (a long ADD, a
    two-token NOOP), the short reply's decision word weighs more; ``token-mean`` counts every reply token once
    across the step (as SFT trainers do), so each decision word weighs the same."""

    episodes: int = 0
    batch_size: int = 8
    epochs: int = 1
    role: str = "memory"
    balance_ops: bool = False
    check_episodes: int = 0
    min_recall: float = 0.0
    loss_agg: str = "seq-mean-token-mean"
    # The SFT steps' learning rate; None = train.lr. An RL phase that moves a warm-started policy in small steps
    # (train.lr) still gets a warm start as fast as imitation alone.
    lr: float | None = None

    def __post_init__(self) -> None:
        if self.lr is not None and self.lr <= 0:
            raise ValueError(f"train.warm_start.lr must be > 0 or null (= train.lr), got {self.lr}")
        if self.episodes < 0:
            raise ValueError(
                f"train.warm_start.episodes must be >= 0 (0 = no warm start), got {self.episodes}"
            )
        if self.batch_size < 1 or self.epochs < 1:
            raise ValueError(
                f"train.warm_start.batch_size and epochs must be >= 1, got {self.batch_size}, {self.epochs}"
            )
        if self.check_episodes < 0 or not 0.0 <= self.min_recall <= 1.0:
            raise ValueError(
                "train.warm_start.check_episodes must be >= 0 and min_recall in [0, 1], got "
                f"{self.check_episodes}, {self.min_recall}"
            )
        if self.loss_agg not in ("seq-mean-token-mean", "token-mean"):
            raise ValueError(
                f"train.warm_start.loss_agg must be 'seq-mean-token-mean' or 'token-mean', got {self.loss_agg!r}"
            )
        if self.role not in WARM_START_ROLES:
            raise ValueError(
                f"train.warm_start.role must be one of {', '.join(map(repr, WARM_START_ROLES))}, got {self.role!r}"
            )
        if self.role == "answer" and (self.check_episodes or self.balance_ops):
            raise ValueError(
                "train.warm_start.check_episodes and balance_ops score and weigh memory writes: set them only with "
                "role='memory' (the answer role is checked by the run's evaluations)"
            )
        if self.min_recall and not self.check_episodes:
            raise ValueError(
                "train.warm_start.min_recall needs check_episodes > 0: the recall is measured on them"
            )


@dataclass
class TrainConfig:
    """LoRA GRPO training.

    One training step = ``data.prompts_per_batch`` prompts × ``data.n_samples_per_prompt`` episodes →
    one batch → ``ppo_epochs`` passes of optimizer updates over ``ppo_mini_batches`` mini-batches, each
    accumulated over micro-batches of one prompt group of ≤ ``micro_batch_size`` rows each (the group's prompt
    is forwarded once; see :mod:`memrl.train.microbatch`).

    ``advantage`` is a name in :data:`memrl.train.advantages.ADVANTAGES` (``grpo``, ``drgrpo``, ``rloo``; ``none``
    for the imitation-only ablation) or a
    dotted path. ``loss_agg`` is a name in :data:`memrl.train.losses.LOSS_AGGREGATIONS`
    (``token-mean``, ``seq-mean-token-sum``, ``seq-mean-token-mean``). ``kl_coef`` > 0 adds a KL penalty to the
    reference policy (``kl_reference``: the same model with the adapter disabled, or the warm start's adapter).
    Leaves flagged ``StepMeta.is_duplicate`` get weight 0 and stay out of the group statistics
    (:func:`memrl.train.advantages.sample_weights`). Which groups train is
    ``data.group_filter``'s decision (the buffer refills dropped groups); ``rollout/mixed_groups`` reports the
    share of groups whose rewards differ. ``tree_local_weight`` > 0 adds tree-local token advantages to tree
    leaves (node values from the tree's own leaves, see :mod:`memrl.train.tree_advantages`); 0 trains every token
    of a leaf on its sequence advantage alone.
    """

    advantage: str = "grpo"
    steps: int = 10
    lr: float = 1e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    max_grad_norm: float = 1.0
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.28
    loss_agg: str = "token-mean"
    kl_coef: float = 0.0
    # The KL's reference: "base" (the model without adapter), "warm_start" (the adapter the warm start ended
    # with, RUN/warm_start/adapter) or "start" (the adapter the run starts from, policy.lora_path): RL then stays
    # near what imitation taught.
    kl_reference: str = "base"
    entropy_coef: float = 0.0
    tree_local_weight: float = 0.0
    ppo_epochs: int = 1
    ppo_mini_batches: int = 1
    micro_batch_size: int = 8
    # Shared prompts of at least this many tokens are forwarded with activation checkpointing, layer by layer (the
    # backward pass recomputes each layer instead of keeping its activations, which grow with the prompt; exact, at
    # one more prompt forward). None: never (short prompts fit and run faster without).
    checkpoint_prompt_tokens: int | None = None
    lora: LoraConfig = field(default_factory=LoraConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    eval_every: int = 5
    eval_episodes: int = 64
    # Start and final evaluation (em_start / em_final with bootstrap intervals); None = eval_episodes; 0 = none
    # (a writer that writes each conversation turn by turn costs minutes per episode: evaluate with memrl eval).
    # The start evaluation of a given model and config is cached and reused across runs and seeds.
    final_eval_episodes: int | None = None
    eval_split: str = "test"
    # Where the start and final evaluation draw from; None = eval_split (the in-run subset is then its head).
    # LoCoMo's memory_r1 split evaluates in-run on the validation conversation and at the end on the test ones.
    final_eval_split: str | None = None
    # Held-out scoring; None = episode.reward. Lets a run train on a shaped reward (e.g. exact match plus partial
    # credit) while eval/em stays the plain metric that em_start / em_final report.
    eval_reward: str | None = None
    checkpoint_every: int = 1
    keep_checkpoints: int = 2
    max_wall_s: float | None = None
    max_generated_tokens: int | None = None
    tensorboard: bool = True
    # Which roles the policy gradient trains (memory.extractor: policy writes "memory" steps): both jointly, or
    # "alternate" phases of role_phase_steps steps, one role trained while the other is frozen (Memory-R1).
    roles: list[str] = field(default_factory=lambda: ["answer", "memory"])
    role_schedule: str = "joint"
    role_phase_steps: int = 5
    # One LoRA plays both roles (shared), or the writer gets an adapter of its own (per_role: the answer adapter
    # is PEFT's "default", the writer's is "memory", saved in the adapter directory's memory/ subfolder).
    role_adapters: str = "shared"
    # Debugging: generate and dump (data.dump_dir) without updating, or train from a dump dir without generating.
    rollout_only: bool = False
    train_only: str | None = None

    def __post_init__(self) -> None:
        if self.steps < 0:
            raise ValueError(f"train.steps must be >= 0, got {self.steps}")
        if self.lr <= 0:
            raise ValueError(f"train.lr must be > 0, got {self.lr}")
        if len(self.betas) != 2:
            raise ValueError(f"train.betas must be two numbers [beta1, beta2], got {self.betas}")
        if self.clip_ratio_low < 0 or self.clip_ratio_high < 0:
            raise ValueError(
                "train.clip_ratio_low/high must be >= 0 (the ratio is clipped to [1-low, 1+high])"
            )
        if self.kl_coef < 0:
            raise ValueError(f"train.kl_coef must be >= 0, got {self.kl_coef}")
        if self.kl_reference not in KL_REFERENCES:
            raise ValueError(f"train.kl_reference must be one of {KL_REFERENCES}, got {self.kl_reference!r}")
        if self.kl_reference == "start" and not self.kl_coef > 0:
            raise ValueError(f"train.kl_reference: start needs train.kl_coef > 0; got kl_coef={self.kl_coef}")
        if self.kl_reference == "warm_start" and not (self.kl_coef > 0 and self.warm_start.episodes):
            raise ValueError(
                "train.kl_reference: warm_start needs train.kl_coef > 0 and a warm start (train.warm_start.episodes"
                f" > 0); got kl_coef={self.kl_coef}, warm_start.episodes={self.warm_start.episodes}"
            )
        if self.tree_local_weight < 0:
            raise ValueError(f"train.tree_local_weight must be >= 0 (0 = off), got {self.tree_local_weight}")
        for name in ("ppo_epochs", "ppo_mini_batches", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_every < 0 or self.checkpoint_every < 0:
            raise ValueError("train.eval_every / checkpoint_every must be >= 0 (0 = only at the end)")
        if self.rollout_only and self.train_only is not None:
            raise ValueError("train.rollout_only and train.train_only exclude each other; set one")
        if self.checkpoint_prompt_tokens is not None and self.checkpoint_prompt_tokens < 1:
            raise ValueError(
                f"train.checkpoint_prompt_tokens must be >= 1 or null, got {self.checkpoint_prompt_tokens}"
            )
        if self.final_eval_episodes is not None and self.final_eval_episodes < 0:
            raise ValueError(
                f"train.final_eval_episodes must be >= 0 or null, got {self.final_eval_episodes}"
            )
        bad = [r for r in self.roles if r not in ROLES]
        if bad or not self.roles:
            raise ValueError(f"train.roles={self.roles}: expected a non-empty subset of {list(ROLES)}")
        if self.role_schedule not in ROLE_SCHEDULES:
            raise ValueError(f"train.role_schedule={self.role_schedule!r}: expected one of {ROLE_SCHEDULES}")
        if self.role_adapters not in ROLE_ADAPTERS:
            raise ValueError(f"train.role_adapters={self.role_adapters!r}: expected one of {ROLE_ADAPTERS}")
        if self.role_phase_steps < 1:
            raise ValueError(f"train.role_phase_steps must be >= 1, got {self.role_phase_steps}")
        if self.keep_checkpoints < 1:
            raise ValueError(f"train.keep_checkpoints must be >= 1, got {self.keep_checkpoints}")
