"""``memrl inspect`` shows the policy's own memory writes: what it read, its operations, the store before and
after, its credit (terminal and HTML)."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console

from memrl.config import load_config
from memrl.episode.pipeline import run_episodes
from memrl.inspect import load_run
from memrl.inspect.html import render_html
from memrl.inspect.terminal import render
from memrl.testing import byte_tokenizer
from memrl.testing.scripted import ScriptedPolicy
from tests.episode.test_memory_writes import script


def _view(out, writer, *overrides):
    """The one episode's view after a run whose memory ``writer`` (a ScriptedPolicy script) writes."""
    cfg = load_config(
        None,
        [
            "data.options={num_episodes: 1}", "tools.enabled=[]", "rollout.n=1", "rollout.max_response_tokens=48",
            "memory.extractor=policy", "memory.top_k=4", "memory.neighbour_turns=0", "episode.record_history_turns=false",
            *overrides, f"output_dir={out}",
        ],
    )  # fmt: skip
    run_episodes(cfg, out, policy=ScriptedPolicy(byte_tokenizer(), writer), progress=False)
    (view,) = load_run(out).episode_views()
    return view


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    return _view(
        tmp_path_factory.mktemp("writes"),
        script,
        "memory.write_max_tokens=400",
        "episode.ingest_chunk_turns=6",
    )


def test_view_replays_each_write_with_the_store_before_and_after(view):
    assert [w.index for w in view.writes] == [0, 1, 2]
    for prev, w in zip(view.writes, view.writes[1:], strict=False):
        assert w.store_before == prev.store_after  # writes chain: each starts where the last one left
    first = view.writes[0]
    assert first.store_before == [] and first.read_turns and first.reply.startswith(("ADD", "NOOP"))
    added = [op.text for op in first.ops if op.op.value == "ADD"]
    assert added and added == first.store_after
    assert all(w.credit is not None for w in view.writes)
    # the synthetic task knows every turn's operation: each write has its score against the gold ones
    assert all(0.0 <= w.op_score <= 1.0 and w.op_right == (w.op_score == 1.0) for w in view.writes)


def test_terminal_and_html_show_the_writes(view):
    console = Console(record=True, width=200)
    render(view, console)
    text = console.export_text()
    assert "Memory writes (the policy's own)" in text and view.writes[0].read_turns[0][:30] in text
    assert f"(F1 {view.writes[0].op_score:.2f})" in text
    html = render_html(view)
    assert '<table id="writes">' in html and "current facts before" in html
    assert f"(F1 {view.writes[0].op_score:.2f})" in html


def test_an_update_the_store_resolved_shows_what_it_changed(tmp_path):
    """A writer that writes every fact as ``UPDATE 0`` over a store whose floor no text reaches: each such write
    is kept as an ADD, and the view says so beside the reply."""

    def updater(ctx):
        if not re.search(r"Operations:\s*(<\|assistant\|>)?\s*$", ctx.text):
            return script(ctx)
        shown = "0. [" in ctx.text.rsplit("Memory:", 1)[-1]
        return "\n".join(
            f"UPDATE 0 {line[4:]}" if shown and line != "NOOP" else line for line in [script(ctx)]
        )

    view = _view(tmp_path, updater, "memory.update_min_cosine=1.0", "episode.ingest_chunk_turns=1")
    resolved = [w for w in view.writes if w.resolved]
    assert resolved and all(w.reply.startswith("UPDATE 0") for w in resolved)
    assert all(op.op.value == "ADD" for w in resolved for op in w.ops)
    (metrics,) = tmp_path.rglob("metrics.json")
    assert json.loads(metrics.read_text())["memory/update_as_add"] == len(resolved)
    assert len(view.writes[-1].store_after) == sum(
        1 for w in view.writes for op in w.ops if op.op.value == "ADD"
    )
    console = Console(record=True, width=200)
    render(view, console)
    assert "kept as an ADD" in console.export_text() and "kept as an ADD" in render_html(view)
