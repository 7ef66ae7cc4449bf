from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from memrl.inspect import load_run, load_training  # noqa: E402
from memrl.inspect.plots import (  # noqa: E402
    plot_memory_size,
    plot_retrieval_hits,
    plot_reward_groups,
    plot_rollback_tokens,
    plot_training_curves,
)


@pytest.fixture(scope="module")
def views(demo_run):
    return load_run(demo_run).episode_views()


def test_episode_plots_draw_the_data(views):
    fig = plot_memory_size(views)
    lines = fig.axes[0].get_lines()
    assert len(lines) == len(views)
    assert list(lines[0].get_ydata()) == [t.facts_after for t in views[0].history]
    fig = plot_reward_groups(views)
    assert len(fig.axes[0].patches) == len({v.group_id for v in views})
    fig = plot_retrieval_hits(views)
    assert fig.axes[0].patches  # hit-rate and recall bars
    fig = plot_rollback_tokens(views)
    heights = [p.get_height() for p in fig.axes[0].patches]
    assert sum(heights) > 0
    plt.close("all")


def test_training_curves_have_four_panels(train_dir):
    fig = plot_training_curves(load_training(train_dir).metrics)
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["reward", "accuracy (held-out EM)", "KL", "entropy"]
    assert all(ax.get_lines() for ax in fig.axes)
    plt.close("all")
