"""Episode inspection: load a ``memrl run`` / ``memrl train`` directory and look at what the agent remembered,
retrieved, generated and was rewarded for (``memrl inspect``, ``notebooks/inspect_episode.ipynb``).

    from memrl.inspect import load_run, write_html
    run = load_run("runs/demo")
    view = run.episode(run.episode_ids()[0])   # EpisodeView: history, facts, summary, retrieved, leaves, tree
    write_html(view, "episode.html")

Heavy libraries (pandas, matplotlib, rich) are imported by the functions that need them.
"""

from __future__ import annotations

from memrl.inspect.load import InspectError, Run, TrainingRun, load_run, load_training
from memrl.inspect.model import (
    EpisodeView,
    FactView,
    HistoryTurnView,
    LeafView,
    RetrievedFactView,
    SpanView,
    TreeNodeView,
    build_episode_view,
)

__all__ = [
    "EpisodeView",
    "FactView",
    "HistoryTurnView",
    "InspectError",
    "LeafView",
    "RetrievedFactView",
    "Run",
    "SpanView",
    "TrainingRun",
    "TreeNodeView",
    "build_episode_view",
    "load_run",
    "load_training",
    "render_html",
    "write_html",
]


def render_html(view: EpisodeView) -> str:
    from memrl.inspect.html import render_html as _render

    return _render(view)


def write_html(view: EpisodeView, path):
    from memrl.inspect.html import write_html as _write

    return _write(view, path)
