from __future__ import annotations

from dataclasses import dataclass


@dataclass
class TrainConfig:
    """LoRA GRPO training (owned by memrl.train)."""

    advantage: str = "grpo"
    steps: int = 10
    lr: float = 1e-4
