"""Target-turn generation: chain and tree strategies with tools and tool-call rollback."""

from memrl.rollout.base import (
    STRATEGIES,
    AgentState,
    RolloutLeaves,
    RolloutRequest,
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
    "RolloutLeaves",
    "RolloutRequest",
    "RolloutStrategy",
    "ToolRunner",
    "TreeConfig",
    "run_rollout",
]
