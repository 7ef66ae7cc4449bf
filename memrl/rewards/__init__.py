"""Reward functions: ``make_reward(name, options, ctx)`` → a batch scorer (see :mod:`memrl.rewards.base`)."""

from memrl.rewards.base import REWARDS, RewardConfigError, RewardContext, RewardFn, RewardInput, make_reward

__all__ = ["REWARDS", "RewardConfigError", "RewardContext", "RewardFn", "RewardInput", "make_reward"]
