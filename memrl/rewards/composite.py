"""``composite``: a weighted sum of other rewards, e.g. answer F1 plus a small format bonus.

reward: composite
reward_options: {parts: {token_f1: 1.0, format: 0.1}, options: {format: {penalty: 0.25}}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from memrl.rewards.base import REWARDS, RewardConfigError, RewardContext, RewardFn, RewardInput, check_options


@dataclass
class CompositeReward:
    parts: list[tuple[float, RewardFn]]
    name: str = "composite"

    def __call__(self, inputs: Sequence[RewardInput]) -> list[float]:
        total = [0.0] * len(inputs)
        for weight, fn in self.parts:
            for i, s in enumerate(fn(inputs)):
                total[i] += weight * s
        return total


@REWARDS.register("composite")
def make_composite(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    opts = check_options("composite", options, {"parts": {}, "options": {}})
    if not opts["parts"]:
        raise RewardConfigError("reward 'composite' needs option parts: {reward_name: weight, ...}")
    unknown = set(opts["options"]) - set(opts["parts"])
    if unknown:
        raise RewardConfigError(
            f"reward 'composite': options given for {sorted(unknown)} which are not in parts"
        )
    parts = [
        (float(w), REWARDS.get(name)(dict(opts["options"].get(name, {})), ctx))
        for name, w in opts["parts"].items()
    ]
    return CompositeReward(parts)
