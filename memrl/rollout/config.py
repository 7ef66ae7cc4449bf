from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RolloutConfig:
    """Target-turn generation strategy (owned by memrl.rollout)."""

    strategy: str = "chain"
    n: int = 4
