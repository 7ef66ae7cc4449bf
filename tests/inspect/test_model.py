"""The episode view model, on a real run (memory replay, retrieval vs gold evidence, the tree) and on
hand-built rows (UPDATE/DELETE replay, chain leaves)."""

from __future__ import annotations

import json

import pytest

from memrl.inspect import load_run
from memrl.inspect.model import LeafView, SpanView, _Memory, build_tree
from memrl.testing import byte_tokenizer
from memrl.types import MemoryOp, MemoryOpType, PathNode


@pytest.fixture(scope="module")
def run(demo_run):
    return load_run(demo_run)


def test_one_view_per_input_with_all_leaves(run):
    ids = run.episode_ids()
    assert len(ids) == 2
    for eid in ids:
        view = run.episode(eid)
        assert view.episode_id == eid
        assert len(view.leaves) == 4  # rollout.n
        assert sorted(leaf.leaf_index for leaf in view.leaves) == [0, 1, 2, 3]
        assert view.question and view.gold_answer is not None and view.gold_evidence
        # a leaf id resolves to its source episode
        assert run.episode(f"{eid}#2").episode_id == eid


def test_memory_replay_matches_what_the_model_was_shown(run):
    """Retrieved facts' texts come from replaying the logged ops; the same texts are in the prompt token ids."""
    tok = byte_tokenizer()
    for eid in run.episode_ids():
        view = run.episode(eid)
        adds = sum(len(op.fact_ids) for t in view.history for op in t.ops if op.op is MemoryOpType.ADD)
        assert view.history[-1].facts_after == adds  # the rule extractor never deletes
        assert [t.facts_after for t in view.history] == sorted(t.facts_after for t in view.history)
        target = next(r for r in run.rows(eid) if r["turn_role"] == "target")
        prompt = tok.decode(list(target["prompt_ids"]))
        assert view.retrieved
        for fact in view.retrieved:
            assert not fact.text.startswith("<fact")
            if fact.in_prompt:
                assert fact.text.split(": ", 1)[-1] in prompt
            assert fact.gold_hit == bool(set(fact.source_ids) & set(view.gold_evidence))
        scores = [f.score for f in view.retrieved]
        assert scores == sorted(scores, reverse=True)
        assert view.summary, "the compressor's COMPRESS op is replayed into the summary"
        # the answer was written back into memory after the question
        assert any(op.op is MemoryOpType.ADD for op in view.answer_ops)
        assert len(view.facts) == adds + sum(
            len(op.fact_ids) for op in view.answer_ops if op.op is MemoryOpType.ADD
        )


def test_leaf_spans_rebuild_the_response_and_separate_tool_tokens(run):
    for eid in run.episode_ids():
        for leaf in run.episode(eid).leaves:
            assert "".join(s.text for s in leaf.spans) == leaf.response_text
            assert leaf.spans[0].start == 0
            assert all(a.end == b.start for a, b in zip(leaf.spans, leaf.spans[1:], strict=False))
            tool_text = "".join(s.text for s in leaf.spans if not s.is_model)
            assert sum(s.end - s.start for s in leaf.spans if not s.is_model) == leaf.tool_tokens
            for call in leaf.tool_calls:
                assert call.result.strip() in tool_text


def test_tree_paths_cover_every_leaf_and_mark_branch_points(run):
    any_branch = False
    for eid in run.episode_ids():
        view = run.episode(eid)
        root = view.root
        assert root is not None and root.start == root.end == 0
        assert sorted(root.leaves) == [0, 1, 2, 3]
        for leaf in view.leaves:
            node = view.tree[leaf.node_uids[-1]]
            assert node.is_leaf and node.end == leaf.spans[-1].end
            text = []
            for uid in leaf.node_uids:
                text.append("".join(s.text for s in view.tree[uid].spans))
            assert "".join(text) == leaf.response_text  # segments along the path = the leaf's response
        for node in view.tree.values():
            assert node.entropy is not None and 0.0 <= node.entropy <= 1.0  # recorded by the tree strategy
            for child in node.children:
                assert view.tree[child].parent == node.uid and view.tree[child].start == node.end
        any_branch |= any(n.is_branch_point for n in view.tree.values())
    assert any_branch


def test_run_has_tool_calls_and_rollbacks_to_show(run):
    views = run.episode_views()
    assert sum(len(leaf.tool_calls) for v in views for leaf in v.leaves) > 0
    rbs = [rb for v in views for _, rb in v.rollbacks]
    assert rbs and all("Error" in rb.error for rb in rbs)


def test_memory_replay_update_delete_and_summary():
    mem = _Memory()
    mem.apply(MemoryOp(MemoryOpType.ADD, "D1:1", fact_ids=(1,), text="Mia has 3 pets", source_ids=("D1:1",)))
    mem.apply(MemoryOp(MemoryOpType.ADD, "D1:2", fact_ids=(2,), text="Mia is 20", source_ids=("D1:2",)))
    mem.apply(
        MemoryOp(
            MemoryOpType.UPDATE, "D2:1", fact_ids=(1,), text="Mia has 4 pets", source_ids=("D1:1", "D2:1")
        )
    )
    mem.apply(MemoryOp(MemoryOpType.DELETE, "D2:2", fact_ids=(2,), text="Mia is 20"))
    mem.apply(MemoryOp(MemoryOpType.COMPRESS, "D2:2", text="pets went up", summary_id=1))
    assert mem.live == 1
    assert mem.facts[1].text == "Mia has 4 pets" and mem.facts[1].updates == 1
    assert mem.facts[1].source_ids == ("D1:1", "D2:1") and mem.facts[1].written_at == "D2:1"
    assert mem.facts[2].deleted and mem.summary == "pets went up"


def _leaf(i: int, text: str) -> LeafView:
    spans = [SpanView(0, len(text), True, text)]
    return LeafView(
        f"e#{i}", i, float(i), "completed", "eos", spans, (), (), [], 0, False, text, len(text), 0
    )


def test_chain_leaves_hang_off_one_root():
    leaves = [_leaf(0, "abc"), _leaf(1, "de")]
    tree = build_tree(leaves, [[], []])
    root = tree["root"]
    assert root.children == ["leaf0", "leaf1"] and not root.is_leaf and root.is_branch_point
    assert root.entropy is None  # a chain records no entropy; views show none rather than a made-up 0
    assert tree["leaf1"].is_leaf and tree["leaf1"].end == 2 and tree["leaf1"].reward(leaves) == 1.0


def test_shared_prefix_nodes_are_merged():
    a, b = _leaf(0, "xxyy"), _leaf(1, "xxzz")
    a.spans = [SpanView(0, 2, True, "xx"), SpanView(2, 4, True, "yy")]
    b.spans = [SpanView(0, 2, True, "xx"), SpanView(2, 4, True, "zz")]
    p = (PathNode("r", 0, 0.1), PathNode("n", 2, 0.7))
    tree = build_tree([a, b], [(*p, PathNode("a", 4)), (*p, PathNode("b", 4))])
    assert tree["n"].children == ["a", "b"] and tree["n"].is_branch_point and tree["n"].entropy == 0.7
    assert tree["n"].leaves == [0, 1] and [s.text for s in tree["b"].spans] == ["zz"]
    assert json.dumps(tree["n"].reward([a, b])) == "0.5"


def test_failed_episode_has_a_view_with_its_reason(tmp_path):
    """A FAILED episode (no steps, manifest entry only) written by the real writer still renders."""
    from rich.console import Console

    from memrl.episode.output import TrajectoryWriter
    from memrl.inspect.html import render_html
    from memrl.inspect.terminal import render
    from memrl.types import EpisodeStatus, EpisodeTrajectory

    failed = EpisodeTrajectory(
        "ep-9", "g-9", (), 0.0, EpisodeStatus.FAILED, failure_reason="prompting: too long"
    )
    TrajectoryWriter(tmp_path).write([failed])
    view = load_run(tmp_path).episode("ep-9")
    assert view.status == "failed" and view.failure_reason == "prompting: too long"
    assert view.leaves == [] and view.tree == {} and view.root is None
    console = Console(record=True, width=120)
    render(view, console)
    assert "FAILED: prompting: too long" in console.export_text()
    assert "FAILED: prompting: too long" in render_html(view)
