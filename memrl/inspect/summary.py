"""Run-level tables built from episode views: one row per episode, memory size per turn, rewards per group."""

from __future__ import annotations

from typing import Any

from memrl.inspect.model import EpisodeView
from memrl.rollout.metrics import AnswerToolUse, answer_tool_use, tool_use_metrics


def leaf_tool_use(view: EpisodeView) -> list[AnswerToolUse]:
    """How each distinct leaf (answer) of the episode used its tools (:mod:`memrl.rollout.metrics`)."""
    return [
        answer_tool_use(leaf.tool_calls, leaf.rollbacks, leaf.response_text, view.gold_answer)
        for leaf in view.leaves
        if not leaf.is_duplicate
    ]


def run_tool_use(views: list[EpisodeView]) -> dict[str, float]:
    """``tooluse/...`` over every answer of the run, as the training loop logs them per step."""
    return tool_use_metrics([u for v in views for u in leaf_tool_use(v)])


def episode_row(view: EpisodeView) -> dict[str, Any]:
    rewards = view.rewards
    unique_rollbacks = {(rb.position, rb.error, rb.tokens_removed) for _, rb in view.rollbacks}
    uses = leaf_tool_use(view)
    return {
        "episode_id": view.episode_id,
        "group_id": view.group_id,
        "category": view.category or "-",
        "status": view.status,
        "leaves": len(view.leaves),
        "reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "reward_max": max(rewards) if rewards else 0.0,
        "gold_hit": view.gold_hit if view.gold_evidence else None,
        "evidence_recall": view.evidence_recall,
        "retrieved": len(view.retrieved),
        "facts_final": sum(not f.deleted for f in view.facts),
        "history_turns": len(view.history),
        "tool_calls": sum(len(leaf.tool_calls) for leaf in view.leaves),
        "failed_calls": sum(u.failed for u in uses),
        "gold_calls": sum(u.gold_calls for u in uses),  # calls whose output is the gold answer
        "copied_results": sum(u.copied for u in uses),  # answers that are their last successful call's output
        "rollbacks": len(unique_rollbacks),
        "rollback_tokens_removed": sum(t for _, _, t in unique_rollbacks),
        "tree_nodes": len(view.tree),
        "branch_points": sum(n.is_branch_point for n in view.tree.values()),
    }


def episode_table(views: list[EpisodeView]):
    """A pandas DataFrame, one row per episode (see :func:`episode_row` for the columns)."""
    import pandas as pd

    return pd.DataFrame([episode_row(v) for v in views])


def memory_size_table(views: list[EpisodeView]):
    """Long table ``episode_id, turn_index, turn_id, live_facts`` (memory size after each history turn)."""
    import pandas as pd

    rows = [
        {"episode_id": v.episode_id, "turn_index": t.index, "turn_id": t.turn_id, "live_facts": t.facts_after}
        for v in views
        for t in v.history
    ]
    return pd.DataFrame(rows, columns=["episode_id", "turn_index", "turn_id", "live_facts"])


def leaf_reward_table(views: list[EpisodeView]):
    """Long table ``group_id, episode_id, leaf_index, reward`` (one row per leaf)."""
    import pandas as pd

    rows = [
        {
            "group_id": v.group_id,
            "episode_id": v.episode_id,
            "leaf_index": leaf.leaf_index,
            "reward": leaf.reward,
        }
        for v in views
        for leaf in v.leaves
    ]
    return pd.DataFrame(rows, columns=["group_id", "episode_id", "leaf_index", "reward"])
