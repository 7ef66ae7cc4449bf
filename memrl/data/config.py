from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DataConfig:
    """Dataset side: which adapter reads which file, and how the data source samples it.

    ``options`` are passed to the adapter as keyword arguments (e.g. synthetic ``num_episodes``).
    """

    adapter: str = "synthetic"
    path: str | None = None
    split: str = "train"
    lenient: bool = False
    limit: int | None = None
    options: dict[str, Any] = field(default_factory=dict)
    n_samples_per_prompt: int = 4
    prompts_per_batch: int = 4
    shuffle: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_samples_per_prompt < 1:
            raise ValueError(f"data.n_samples_per_prompt must be >= 1, got {self.n_samples_per_prompt}")
        if self.prompts_per_batch < 1:
            raise ValueError(f"data.prompts_per_batch must be >= 1, got {self.prompts_per_batch}")
