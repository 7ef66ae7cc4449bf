"""Matplotlib figures for a run (episodes) and a training run (curves). Every function returns the Figure.

Figures are created with ``matplotlib.figure.Figure`` semantics through pyplot so notebooks show them inline;
call ``fig.savefig(path)`` to keep one.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from memrl.inspect.model import EpisodeView
from memrl.inspect.summary import episode_table, leaf_reward_table, memory_size_table


def _subplots(figsize=(6.5, 3.6)):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=figsize)
    ax.grid(alpha=0.3)
    return fig, ax


def plot_memory_size(views: list[EpisodeView]):
    """Live facts after each history turn, one line per episode."""
    fig, ax = _subplots()
    table = memory_size_table(views)
    for eid, part in table.groupby("episode_id", sort=False):
        ax.plot(part["turn_index"], part["live_facts"], marker=".", label=str(eid))
    ax.set_xlabel("history turn")
    ax.set_ylabel("live facts in memory")
    ax.set_title("Memory size over turns")
    if 0 < table["episode_id"].nunique() <= 8:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_retrieval_hits(views: list[EpisodeView]):
    """Share of episodes whose retrieved facts hit at least one gold evidence turn, and mean evidence recall,
    per question category (episodes without gold evidence are left out)."""
    fig, ax = _subplots()
    table = episode_table(views)
    table = table[table["gold_hit"].notna()]
    if table.empty:
        ax.text(0.5, 0.5, "no episodes with gold evidence", ha="center", va="center", transform=ax.transAxes)
        return fig
    by = table.groupby("category")
    cats = list(by.groups)
    hit = [float(by.get_group(c)["gold_hit"].astype(float).mean()) for c in cats]
    recall = [float(by.get_group(c)["evidence_recall"].astype(float).mean()) for c in cats]
    x = range(len(cats))
    ax.bar([i - 0.2 for i in x], hit, width=0.4, label="hit rate (any gold turn)")
    ax.bar([i + 0.2 for i in x], recall, width=0.4, label="evidence recall")
    for i, c in enumerate(cats):
        ax.text(i, 1.02, f"n={len(by.get_group(c))}", ha="center", fontsize=7)
    ax.set_xticks(list(x), [str(c) for c in cats])
    ax.set_ylim(0, 1.12)
    ax.set_ylabel("fraction")
    ax.set_title("Retrieval vs gold evidence by category")
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def plot_reward_groups(views: list[EpisodeView]):
    """Leaf rewards per GRPO group (dots, jittered) with the group mean (bar)."""
    import numpy as np

    fig, ax = _subplots((max(4.0, 0.6 * len(views) + 2), 3.6))
    table = leaf_reward_table(views)
    groups = list(dict.fromkeys(table["group_id"]))
    rng = np.random.default_rng(0)
    for i, g in enumerate(groups):
        r = table[table["group_id"] == g]["reward"].to_numpy()
        ax.bar(i, r.mean(), color="#cfd8e3", width=0.7)
        ax.scatter(i + rng.uniform(-0.2, 0.2, len(r)), r, s=18, color="#1f5fa8", zorder=3)
    ax.set_xticks(range(len(groups)), [g[-18:] for g in groups], rotation=30, ha="right", fontsize=7)
    ax.set_ylabel("leaf reward")
    ax.set_title("Reward distribution per group (bar = mean)")
    fig.tight_layout()
    return fig


def plot_rollback_tokens(views: list[EpisodeView]):
    """Tokens removed by tool rollback per episode: failed calls (and their error text) that never reach the
    trained trajectory or the context of later tokens."""
    fig, ax = _subplots()
    table = episode_table(views)
    ax.bar(range(len(table)), table["rollback_tokens_removed"], color="#c0504d")
    for i, (n, tok) in enumerate(zip(table["rollbacks"], table["rollback_tokens_removed"], strict=True)):
        ax.text(i, tok, f"{n} rb", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(
        range(len(table)), [e[-18:] for e in table["episode_id"]], rotation=30, ha="right", fontsize=7
    )
    ax.set_ylabel("tokens removed")
    ax.set_title(f"Tokens saved by rollback (total {int(table['rollback_tokens_removed'].sum())})")
    fig.tight_layout()
    return fig


# Curves of a `memrl train` run: panel title → candidate keys (first present wins per series).
TRAIN_PANELS: dict[str, list[str]] = {
    "reward": ["train/reward_mean", "rollout/reward_mean"],
    "accuracy (held-out EM)": ["eval/em"],
    "KL": ["train/kl_ref", "train/approx_kl"],
    "entropy": ["train/entropy"],
}


def plot_training_curves(metrics: Any, x: str = "step"):
    """2×2 panels (reward, held-out accuracy, KL, entropy) from a ``metrics.jsonl`` DataFrame."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(9, 6))
    drawn = defaultdict(int)
    for ax, (title, keys) in zip(axes.flat, TRAIN_PANELS.items(), strict=True):
        for key in keys:
            if key not in metrics:
                continue
            part = metrics[[x, key]].dropna()
            if part.empty:
                continue
            ax.plot(part[x], part[key], marker="o" if len(part) < 30 else None, label=key)
            drawn[title] += 1
        ax.set_title(title)
        ax.set_xlabel(x)
        ax.grid(alpha=0.3)
        if drawn[title]:
            ax.legend(fontsize=7)
        else:
            ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes, color="gray")
    fig.tight_layout()
    return fig
