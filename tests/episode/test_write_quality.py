"""The writer's quality in `memrl eval`: decisions against gold, from the rows an evaluation writes."""

from __future__ import annotations

import json

import pytest
from transformers import ByT5Tokenizer

from memrl.episode.write_quality import gold_kinds, render_write_quality, write_quality


def _row(
    gold: str | None, written: list[str], *, right: bool = False, role: str = "history", **extra
) -> dict:
    x = {"role": "memory", "applied": True, "op_right": right, "op_score": 1.0 if right else 0.0, **extra}
    if gold is not None:
        x["gold_ops"] = gold
    # The ops as the Parquet rows hold them: an UPDATE names the old fact and the new one.
    ids = {"ADD": [1], "UPDATE": [0, 1], "NOOP": []}
    ops = [{"op": op, "turn_id": "D1:1", "fact_ids": ids[op], "text": ""} for op in written]
    return {"turn_role": role, "extra": json.dumps(x), "memory_ops": json.dumps(ops)}


def test_gold_kinds_reads_one_operation_per_line():
    assert gold_kinds("UPDATE 0 Mia lives in Rome.\nNOOP\n\nADD Bo is 3 years old.") == [
        "UPDATE",
        "NOOP",
        "ADD",
    ]


def test_recall_precision_and_confusion_of_one_turn_writes():
    rows = [
        _row("ADD Ann lives in Oslo.", ["ADD"], right=True),
        _row("ADD Bo has 2 pets.", ["UPDATE"]),  # a new fact written over another one
        _row("UPDATE 1 Ann lives in Rome.", ["UPDATE"], right=True),
        _row("UPDATE 0 Bo has 3 pets.", ["ADD"]),  # the stale value stays current
        _row("NOOP", ["NOOP"], right=True),
    ]
    q = write_quality(rows)
    assert (
        q["writes"] == 5
        and q["ops_right"] == pytest.approx(3 / 5)
        and q["op_score_mean"] == pytest.approx(0.6)
    )
    assert q["gold"] == {"ADD": 2, "NOOP": 1, "UPDATE": 2} and q["written"] == {
        "ADD": 2,
        "NOOP": 1,
        "UPDATE": 2,
    }
    assert q["recall"] == {"ADD": 0.5, "NOOP": 1.0, "UPDATE": 0.5}
    assert q["precision"] == {"ADD": 0.5, "NOOP": 1.0, "UPDATE": 0.5}
    assert q["confusion"] == {
        "ADD": {"ADD": 1, "UPDATE": 1},
        "NOOP": {"NOOP": 1},
        "UPDATE": {"ADD": 1, "UPDATE": 1},
    }


def test_chunk_writes_match_as_multisets_and_stay_out_of_the_confusion():
    q = write_quality([_row("ADD Ann lives in Oslo.\nNOOP\nUPDATE 0 Bo has 3 pets.", ["ADD", "ADD", "NOOP"])])
    assert q["recall"] == {"ADD": 1.0, "NOOP": 1.0, "UPDATE": 0.0}
    assert q["precision"] == {"ADD": 0.5, "NOOP": 1.0} and q["confusion"] == {}


def test_only_applied_writes_with_known_gold_count():
    rows = [
        _row("ADD Ann lives in Oslo.", ["ADD"], right=True),
        _row("ADD Ann lives in Oslo.", ["NOOP"], applied=False),  # a sampled alternative, scored on a fork
        _row(None, ["ADD"]),  # a dataset without gold operations (LoCoMo)
        _row("NOOP", [], role="target"),
    ]
    q = write_quality(rows)
    assert q["writes"] == 1 and q["recall"] == {"ADD": 1.0}
    # Without gold operations only the faithfulness of the applied writes is known; no policy write at all: None.
    assert set(write_quality(rows[2:])) == {"faithfulness"}
    assert write_quality(rows[3:]) is None and write_quality([]) is None


def _write_row(kinds: list[str], written: int, unsupported: list[str], gold: str | None = None) -> dict:
    write = {"index": 0, "turn_kinds": kinds, "facts_written": written, "unsupported_facts": unsupported,
             "gold_ops": gold}  # fmt: skip
    extra = {"read_turns": ["Lucia: Makes sense."]}
    return {"turn_role": "history", "role": "memory", "write": json.dumps(write), "extra": json.dumps(extra),
            "memory_ops": "[]"}  # fmt: skip


def test_faithfulness_splits_invented_facts_by_the_kind_of_turn_read():
    rows = [
        _write_row(["small_talk"], 1, ["Diego is a musician."]),
        _write_row(["small_talk"], 0, []),
        _write_row(["change"], 1, [], gold="UPDATE 0 Priya lives in Porto."),
        _write_row(["small_talk", "first"], 2, []),  # a chunk write counts under its most demanding turn
    ]
    q = write_quality(rows)
    f = q["faithfulness"]
    assert f["writes"] == 4 and f["invented_rate"] == 0.25 and q["writes"] == 1  # one write has gold
    assert f["by_turn_kind"]["small_talk"] == {
        "writes": 2, "write_rate": 0.5, "invented_rate": 0.5, "facts": 1, "unsupported_fact_share": 1.0,
    }  # fmt: skip
    assert f["by_turn_kind"]["first"]["facts"] == 2 and f["by_turn_kind"]["change"]["invented_rate"] == 0.0
    assert f["examples"] == [
        {"kind": "small_talk", "read": "Lucia: Makes sense.", "invented": ["Diego is a musician."]}
    ]
    line = render_write_quality("memory", q)
    assert line.endswith("invented facts by turn kind: change 0.000 (write 1.000), first 0.000 (write 1.000), "
                         "small_talk 0.500 (write 0.500)")  # fmt: skip
    assert render_write_quality("memory", write_quality(rows[:2])).startswith(
        "memory writes (memory): 2; invented"
    )


def test_render_names_the_arm_and_every_decision():
    q = write_quality([_row("ADD Ann lives in Oslo.", ["ADD"], right=True), _row("NOOP", ["ADD"])])
    line = render_write_quality("memory", q)
    assert line.startswith("memory writes (memory): 2, ops right 0.500")
    assert "recall ADD 1.000 NOOP 0.000" in line and "precision ADD 0.500" in line


def test_an_evaluation_of_policy_written_memory_reports_its_writes(tmp_path):
    """Real episodes, MiniLM and FAISS, a scripted writer that ADDs every statement and never UPDATEs: the report
    holds every one-turn write, and the changes it ADDed show as UPDATE → ADD."""
    from memrl.config import load_config
    from memrl.episode.evaluate import evaluate_ablations
    from memrl.episode.report_table import render_eval
    from memrl.testing.scripted import ScriptedPolicy
    from tests.episode.test_memory_writes import script

    cfg = load_config(
        None,
        [
            f"output_dir={tmp_path}",
            "data.options={num_episodes: 3}",
            "data.split=test",
            "tools.enabled=[]",
            "rollout.n=1",
            "rollout.max_response_tokens=48",
            "memory.extractor=policy",
            "memory.write_max_tokens=64",
            "memory.neighbour_turns=0",
            "episode.record_history_turns=false",
            "episode.ingest_chunk_turns=1",
            "episode.eval_ablations=[memory, no_memory]",
        ],
    )
    report = evaluate_ablations(cfg, policy=ScriptedPolicy(ByT5Tokenizer(), script), progress=False)
    q = report["ablations"]["memory"]["memory_writes"]
    assert (
        q["writes"]
        == 3 * 18
        == sum(q["gold"].values())
        == sum(sum(c.values()) for c in q["confusion"].values())
    )
    assert q["gold"]["UPDATE"] > 0 and q["recall"]["UPDATE"] == 0.0 and "UPDATE" not in q["written"]
    # The script copies the turns it ADDs ("The weather is nice today." too): nothing is invented.
    faith = q["faithfulness"]
    assert faith["writes"] == 3 * 18 and faith["invented_rate"] == 0.0
    assert faith["by_turn_kind"]["small_talk"]["write_rate"] > 0
    assert q["confusion"]["UPDATE"] == {"ADD": q["gold"]["UPDATE"]}
    assert q["recall"]["ADD"] > 0.5 and q["recall"]["NOOP"] > 0.5
    assert "memory_writes" in json.loads((tmp_path / "eval.json").read_text())["ablations"]["memory"]
    # Without memory in the prompt no memory is built, so that arm has no writes to report.
    assert "memory_writes" not in report["ablations"]["no_memory"]
    assert "memory writes (memory): 54" in render_eval(report)


def test_an_evaluation_on_the_held_out_chats_splits_questions_and_writes_by_kind(tmp_path):
    """``memrl eval`` on the chats by name (configs/chats_eval_writer.yaml, one chat): scores per question kind,
    and the writes' faithfulness per turn kind. The scripted writer copies the turns it ADDs: nothing invented."""
    from memrl.config import load_config
    from memrl.episode.evaluate import evaluate_ablations
    from memrl.testing.scripted import ScriptedPolicy
    from tests.episode.test_memory_writes import script

    cfg = load_config(
        "configs/chats_eval_writer.yaml",
        [
            f"output_dir={tmp_path}",
            "data.options={num_chats: 1}",
            "memory.write_max_tokens=64",
            "memory.write_cache=false",
        ],  # fmt: skip
    )
    report = evaluate_ablations(cfg, policy=ScriptedPolicy(ByT5Tokenizer(), script), progress=False)
    memory = report["ablations"]["memory"]
    assert report["dataset"] == "chats"
    assert memory["group_sizes"] == {"before": 3, "never_changed": 3, "now": 3}  # scored per question kind
    faith = memory["memory_writes"]["faithfulness"]
    assert faith["writes"] == 48 and set(faith["by_turn_kind"]) == {"small_talk", "first", "change"}
    assert faith["invented_rate"] == 0.0
