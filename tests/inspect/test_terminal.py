from __future__ import annotations

from rich.console import Console

from memrl.inspect import load_run
from memrl.inspect.summary import episode_row
from memrl.inspect.terminal import render, render_run_table


def test_terminal_view_shows_every_section(demo_run):
    run = load_run(demo_run)
    for eid in run.episode_ids():
        view = run.episode(eid)
        console = Console(record=True, width=200)
        render(view, console)
        out = console.export_text()
        assert view.question in out and "History turns" in out and "Final memory" in out
        assert view.retrieved[0].text in out and "Generation tree" in out
        for leaf in view.leaves:
            assert f"leaf {leaf.leaf_index}  reward {leaf.reward:.2f}" in out
        for _, rb in view.rollbacks:
            assert f"rollback @{rb.position}" in out


def test_run_table_lists_episodes(demo_run):
    run = load_run(demo_run)
    console = Console(record=True, width=200)
    render_run_table([episode_row(v) for v in run.episode_views()], console)
    out = console.export_text()
    assert all(eid in out for eid in run.episode_ids())
