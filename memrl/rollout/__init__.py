"""Target-turn generation: chain and tree strategies with tools and tool-call rollback."""

from memrl.rollout.base import (
    STRATEGIES,
    AgentState,
    RolloutRequest,
    RolloutResult,
    RolloutStrategy,
    ToolRunner,
    run_rollout,
)
from memrl.rollout.config import RollbackConfig, RolloutConfig, TreeConfig

__all__ = [
    "STRATEGIES",
    "AgentState",
    "RollbackConfig",
    "RolloutConfig",
    "RolloutRequest",
    "RolloutResult",
    "RolloutStrategy",
    "ToolRunner",
    "TreeConfig",
    "run_rollout",
]
