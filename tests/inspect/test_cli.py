"""``memrl inspect`` end to end through the CLI entry point."""

from __future__ import annotations

from memrl.cli.main import main
from memrl.inspect import load_run


def test_lists_episodes(demo_run, capsys):
    assert main(["inspect", str(demo_run), "--width", "180"]) == 0
    out = capsys.readouterr().out
    assert all(eid in out for eid in load_run(demo_run).episode_ids())


def test_episode_view_and_html(demo_run, tmp_path, capsys):
    eid = load_run(demo_run).episode_ids()[1]
    out_html = tmp_path / "ep.html"
    assert main(["inspect", str(demo_run), "--episode", eid, "--html", str(out_html), "--width", "180"]) == 0
    out = capsys.readouterr().out
    assert "History turns" in out and "Retrieved for the question" in out and f"wrote {out_html}" in out
    assert '<svg id="tree"' in out_html.read_text()


def test_bad_inputs_exit_2_with_a_reason(demo_run, tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 2
    assert "not a memrl run directory" in capsys.readouterr().err
    assert main(["inspect", str(demo_run), "--episode", "missing"]) == 2
    assert "no episode 'missing'" in capsys.readouterr().err
    assert main(["inspect", str(demo_run), "--html", str(tmp_path / "x.html")]) == 2
    assert "--html needs --episode" in capsys.readouterr().err


def test_the_episode_list_ends_with_the_runs_tool_use(demo_run, capsys):
    from memrl.inspect.summary import episode_row, run_tool_use

    views = load_run(demo_run).episode_views()
    m = run_tool_use(views)
    # The demo agent computes with python, sometimes with a bug the rollback repairs, then mostly copies.
    assert m["tooluse/calls_per_answer"] > 0 and m["tooluse/rollbacks"] > 0
    leaves = [leaf for v in views for leaf in v.leaves if not leaf.is_duplicate]
    copied = sum(
        leaf.response_text.endswith(f"<answer>{leaf.tool_calls[-1].result.strip()}</answer>")
        for leaf in leaves
        if leaf.tool_calls and leaf.tool_calls[-1].status == "ok"
    )
    assert copied == sum(episode_row(v)["copied_results"] for v in views) > 0
    assert main(["inspect", str(demo_run), "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert f"tool use over {len(leaves)} answers: {m['tooluse/calls_per_answer']:.2f} calls per answer" in out
