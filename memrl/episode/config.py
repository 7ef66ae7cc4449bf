from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EpisodeConfig:
    """Prompting, reward and rollout workers (owned by memrl.episode)."""

    reward: str = "exact_match"
    prompt_template: str = "target_turn.j2"
    prompt_token_budget: int = 1536
