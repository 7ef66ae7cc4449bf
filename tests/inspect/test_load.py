"""Loading run / training directories, and the errors for broken ones (they name the file and the problem)."""

from __future__ import annotations

import json
import shutil

import pyarrow.parquet as pq
import pytest

from memrl.inspect import InspectError, load_run, load_training


def test_load_run_reads_every_committed_episode(demo_run):
    run = load_run(demo_run)
    manifests = [
        e
        for p in sorted((demo_run / "manifests").glob("*.json"))
        for e in json.loads(p.read_text())["episodes"]
    ]
    assert len(run.episodes_meta) == len(manifests) == 8  # 2 inputs x 4 leaves
    assert set(run.steps["episode_id"]) == {e["episode_id"] for e in manifests}
    assert run.metrics["run/inputs"] == 2.0


def test_unknown_episode_lists_valid_ids(demo_run):
    run = load_run(demo_run)
    with pytest.raises(InspectError, match="no episode 'nope'.*synthetic-train"):
        run.episode("nope")


def test_not_a_run_dir(tmp_path):
    with pytest.raises(InspectError, match="not a memrl run directory"):
        load_run(tmp_path)


def test_broken_manifest_names_the_file(demo_run, tmp_path):
    bad = tmp_path / "run"
    shutil.copytree(demo_run, bad)
    (bad / "manifests" / "part-00000.json").write_text("{not json")
    with pytest.raises(InspectError, match=r"part-00000\.json: not valid JSON"):
        load_run(bad)


def test_missing_column_names_part_and_column(demo_run, tmp_path):
    bad = tmp_path / "run"
    shutil.copytree(demo_run, bad)
    part = bad / "trajectories" / "part-00000.parquet"
    table = pq.read_table(part)
    pq.write_table(table.drop(["memory_ops"]), part)
    with pytest.raises(InspectError, match=r"part-00000\.parquet: missing columns \['memory_ops'\]"):
        load_run(bad)


def test_uncommitted_part_is_ignored(demo_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(demo_run, run_dir)
    shutil.copy(
        run_dir / "trajectories" / "part-00000.parquet", run_dir / "trajectories" / "part-00009.parquet"
    )
    assert len(load_run(run_dir).steps) == len(load_run(demo_run).steps)


def test_bad_json_field_names_row_and_field(demo_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(demo_run, run_dir)
    part = run_dir / "trajectories" / "part-00000.parquet"
    df = pq.read_table(part).to_pandas()
    df.loc[3, "tool_calls"] = "[oops"
    df.to_parquet(part)
    run = load_run(run_dir)
    with pytest.raises(InspectError, match=r"row 3 .*field 'tool_calls' is not valid JSON"):
        run.episode(run.episode_ids()[0])


def test_load_training(train_dir, tmp_path):
    tr = load_training(train_dir)
    assert list(tr.metrics["step"]) == list(range(9))
    assert tr.metrics["eval/em"].notna().sum() == 3 and tr.summary["em_final"] == 0.5
    with pytest.raises(InspectError, match="no metrics.jsonl"):
        load_training(tmp_path)


def test_parts_written_before_the_typed_step_fields_read_the_same(demo_run, tmp_path):
    """Older parts had no tree_path / finish / leaf_index / response_text / included_fact_ids columns: the
    target rows kept them in the ``extra`` JSON."""
    old = tmp_path / "run"
    shutil.copytree(demo_run, old)
    moved = ["tree_path", "finish", "leaf_index", "response_text", "included_fact_ids"]
    for part in (old / "trajectories").glob("*.parquet"):
        df = pq.read_table(part).to_pandas()
        extras = []
        for _, r in df.iterrows():
            extra = json.loads(r["extra"])
            if r["turn_role"] == "target":
                extra.update(
                    tree_path=json.loads(r["tree_path"]),
                    finish=r["finish"] or "",
                    leaf_index=int(r["leaf_index"]),
                    response_text=r["response_text"],
                    included_fact_ids=[int(x) for x in r["included_fact_ids"]],
                )
            extras.append(json.dumps(extra))
        df["extra"] = extras
        df.drop(columns=moved).to_parquet(part)
    new, legacy = load_run(demo_run), load_run(old)
    assert "tree_path" not in legacy.steps.columns
    for eid in new.episode_ids():
        view = new.episode(eid)
        assert any(leaf.finish for leaf in view.leaves) and len(view.tree) > 2
        assert legacy.episode(eid) == view
