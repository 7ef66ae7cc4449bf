"""``chain``: ``n`` independent samples per request (the baseline). The ``n`` chains of a request start as one
request with ``n`` samples, so the shared prompt is computed once (as vLLM prefix caching would give it)."""

from __future__ import annotations

from collections.abc import Sequence

from memrl.policy.base import PolicyClient
from memrl.rollout.base import STRATEGIES, RolloutLeaves, RolloutRequest, ToolRunner
from memrl.rollout.branch import Branch
from memrl.rollout.config import RolloutConfig
from memrl.rollout.engine import Engine
from memrl.rollout.metrics import RolloutMetrics


@STRATEGIES.register("chain")
def chain_rollout(
    requests: Sequence[RolloutRequest], policy: PolicyClient, tools: ToolRunner | None, cfg: RolloutConfig
) -> RolloutLeaves:
    metrics = RolloutMetrics()
    engine = Engine(policy, tools, cfg, metrics)
    branches = [
        Branch(
            uid=f"{req.request_id}/chain{i}",
            request_index=k,
            request=req,
            tokens=list(req.prompt_ids),
            spawn_key=f"{req.request_id}/prompt",
        )
        for k, req in enumerate(requests)
        for i in range(cfg.n)
    ]
    engine.run(branches)
    leaves: list[list] = [[] for _ in requests]
    for b in branches:
        index = len(leaves[b.request_index])
        leaves[b.request_index].append(b.to_step(b.uid, node_path=(index,)))
    metrics.add("rollout/leaves", len(branches))
    return RolloutLeaves(leaves=leaves, metrics=metrics.summary())
