from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class BatchConfig:
    """TrajectoryBatchBuilder settings (``data.batch.*``).

    ``untrained_steps``: what a row does with a history-turn step that carries nothing to train (no write
    credit): ``drop`` it, or ``mask`` it (kept as a row with response_mask 0 and reward 0).
    ``max_prompt_len`` / ``max_response_len``: optional limits; on overflow ``raise`` (default) or ``truncate``
    (prompt keeps its last tokens, response its first; the row is flagged in ``PackedBatch.truncated``).
    """

    layout: str = "padded"
    untrained_steps: str = "drop"
    max_prompt_len: int | None = None
    max_response_len: int | None = None
    on_overflow: str = "raise"
    pad_token_id: int = 0

    def __post_init__(self) -> None:
        choices = {
            "layout": ("padded", "packed"),
            "untrained_steps": ("drop", "mask"),
            "on_overflow": ("raise", "truncate"),
        }
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise ValueError(f"data.batch.{name}={getattr(self, name)!r}; valid: {', '.join(valid)}")
        for name in ("max_prompt_len", "max_response_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"data.batch.{name} must be >= 1 or null (no limit), got {value}")


@dataclass
class DataConfig:
    """Dataset side: which adapter reads which file, and how the data source samples it.

    ``options`` are passed to the adapter as keyword arguments (e.g. synthetic ``num_episodes``).
    ``split``: ``train`` | ``validation`` | ``test`` | ``all``; LoCoMo/LongMemEval split by conversation/question
    hash (adapter option ``test_fraction``; LoCoMo also by the published ``split_scheme: memory_r1``, the only
    scheme with a validation split), synthetic draws test episodes from held-out names and values.
    ``lenient``: skip bad records (each skip is reported) instead of failing on the first one.

    A training step draws ``prompts_per_batch`` groups through the :class:`~memrl.data.buffer.RolloutBuffer`:
    each group is ``n_samples_per_prompt`` copies of one prompt (distinct episode ids, one ``group_id``), each
    copy a whole episode (memory included) whose rollout makes ``rollout.n`` leaves. The default of one copy
    lets the rollout make the group (a tree shares prefixes between its leaves; copies share nothing).
    ``group_filter`` decides which finished groups train (``dynamic_sampling``: only groups whose rewards
    differ); dropped groups are refilled by drawing again, up to ``max_sampling_rounds`` rounds per step.
    ``dump_dir`` writes every rollout as JSONL (``rollout_<step>.jsonl``) for ``train.train_only`` replays.
    """

    adapter: str = "synthetic"
    path: str | None = None
    split: str = "train"
    lenient: bool = False
    limit: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    n_samples_per_prompt: int = 1
    prompts_per_batch: int = 4
    shuffle: bool = True
    seed: int = 0
    # RolloutBuffer: pre-rollout sampler, post-rollout group filter (keep_all | dynamic_sampling), debug dumps.
    buffer_sampler: str = "pop_first"
    group_filter: str = "keep_all"
    max_sampling_rounds: int = 4
    dump_dir: str | None = None
    batch: BatchConfig = field(default_factory=BatchConfig)

    def __post_init__(self) -> None:
        if self.n_samples_per_prompt < 1:
            raise ValueError(f"data.n_samples_per_prompt must be >= 1, got {self.n_samples_per_prompt}")
        if self.max_sampling_rounds < 1:
            raise ValueError(f"data.max_sampling_rounds must be >= 1, got {self.max_sampling_rounds}")
        if self.prompts_per_batch < 1:
            raise ValueError(f"data.prompts_per_batch must be >= 1, got {self.prompts_per_batch}")
        if self.split not in ("train", "validation", "test", "all"):
            raise ValueError(
                f"data.split={self.split!r}; valid: train, validation (where the dataset defines one), test, all"
                " (all = the whole dataset)"
            )
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"data.limit must be >= 0 or null (no limit), got {self.limit}")
