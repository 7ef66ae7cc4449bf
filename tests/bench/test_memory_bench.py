"""``memrl bench memory`` on the repo's mini fixtures (fast) and a real-data subset (slow)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memrl.adapters import FIXTURES
from memrl.bench import BENCHES
from memrl.bench.memory import _session_ids, recall

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REAL_LOCOMO = Path("/work/shared/data/locomo/locomo10.json")  # present on the build machine only
KEYS = (
    "recall@5",
    "recall@10",
    "recall@25",
    "baseline_dense_recall@10",
    "baseline_bm25_recall@10",
    "turn_recall@10",
    "baseline_bm25_turn_recall@10",
    "context_token_fraction",
    "ingest_turns_per_s",
)


def test_recall_counts_gold_ids_among_source_ids_of_top_k():
    ranked = [("D1:1", "D1:2"), ("D3:4",), ("D9:9",)]
    assert recall(ranked, ["D1:2", "D9:9"], 2, set) == 0.5
    assert recall(ranked, ["D1:2", "D9:9"], 3, set) == 1.0
    assert _session_ids(["sess:a:3", "sess:a:4", "b:0"]) == {"sess:a", "b"}


def check(result: dict) -> None:
    for key in KEYS:
        assert key in result, key
    for key in KEYS[:7]:
        assert 0.0 <= result[key] <= 1.0
    assert result["recall@5"] <= result["recall@10"] <= result["recall@25"]
    assert result["baseline_bm25_recall@5"] <= result["baseline_bm25_recall@25"]
    assert 0.0 < result["context_token_fraction"] <= 1.0
    assert result["ingest_turns_per_s"] > 0
    assert set(result["recall@10_by_category"]) == set(result["baseline_dense_recall@10_by_category"])


def test_bench_on_locomo_fixture():
    result = BENCHES.get("memory")(["--dataset", "locomo", "--path", str(FIXTURES / "locomo_mini.json")])
    check(result)
    assert result["conversations"] == 1 and result["facts"] == 35
    # The same data again: every text comes from the persistent embedding cache.
    again = BENCHES.get("memory")(["--dataset", "locomo", "--path", str(FIXTURES / "locomo_mini.json")])
    assert again["memory/embed_cache_misses"] == 0 and again["memory/embed_cache_hit_rate"] == 1.0
    assert again["recall@10"] == result["recall@10"]
    assert result["config"]["embedder_dtype"] == "auto"
    assert result["embedder_dtype"] in ("float32", "bfloat16")  # auto, resolved for this CPU


def test_bench_on_a_full_disk_warns_once_and_equals_the_uncached_run(tmp_path, monkeypatch, caplog):
    """The cache file may not grow (SQLite's page limit, as a full disk): the bench still finishes, its
    results equal the uncached run's and the metrics say writes stopped."""
    import sqlite3

    from memrl import blob_cache
    from memrl.memory import embedder

    connect = sqlite3.connect

    def full_disk_connect(*args, **kwargs):
        db = connect(*args, **kwargs)
        db.execute("PRAGMA max_page_count = 1")  # clamped to the pages the file already holds
        return db

    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(embedder, "_CACHE", {})
    monkeypatch.setattr(blob_cache.sqlite3, "connect", full_disk_connect)
    argv = ["--dataset", "locomo", "--path", str(FIXTURES / "locomo_mini.json")]
    with caplog.at_level("WARNING", logger="memrl.blob_cache"):
        full = BENCHES.get("memory")(argv)
    uncached = BENCHES.get("memory")([*argv, "embedding_cache=false"])
    assert full["memory/embed_cache_writes_stopped"] == 1.0 and full["memory/embed_cache_hits"] == 0
    assert [r.levelname for r in caplog.records if r.name == "memrl.blob_cache"] == ["WARNING"]
    for key in KEYS[:-1]:  # everything but the throughput
        assert full[key] == uncached[key], key


def test_bench_memory_takes_the_embedder_dtype_override():
    result = BENCHES.get("memory")(
        ["--path", str(FIXTURES / "locomo_mini.json"), "--no-baselines", "embedder_dtype=float32"]
    )
    assert result["embedder_dtype"] == "float32" and result["facts"] == 35


def test_bench_rejects_unknown_override():
    with pytest.raises(SystemExit):
        BENCHES.get("memory")(["--path", str(FIXTURES / "locomo_mini.json"), "no_such_key=1"])


@pytest.mark.slow
def test_bench_on_longmemeval_fixture():
    result = BENCHES.get("memory")(
        ["--dataset", "longmemeval", "--path", str(FIXTURES / "longmemeval_mini.json"), "neighbour_turns=0"]
    )
    check(result)
    assert result["questions"] == 2  # the abstention question has no answer session to find


@pytest.mark.slow
def test_bench_on_real_locomo_subset():
    if not REAL_LOCOMO.is_file():
        pytest.skip(f"{REAL_LOCOMO} not present")
    result = BENCHES.get("memory")(
        ["--dataset", "locomo", "--path", str(REAL_LOCOMO), "--limit", "1", "--no-baselines"]
    )
    assert result["recall@10"] >= 0.6 and result["context_token_fraction"] <= 0.1


def test_histories_are_streamed_one_at_a_time(tmp_path):
    """The bench reads a history's episodes only when it gets to it (one episode ahead, to see where the
    history ends): a broken later record surfaces there, not before the first history is scored."""
    import json

    from memrl.bench.memory import iter_conversations
    from memrl.data.adapters import AdapterError

    records = json.loads((FIXTURES / "longmemeval_mini.json").read_text())
    records[2]["question_date"] = "someday"
    path = tmp_path / "lme.json"
    path.write_text(json.dumps(records))
    convs = iter_conversations("longmemeval", str(path), set(), None)
    first = next(convs)
    assert first.key == "longmemeval-0f05491a" and first.questions[0].gold == (
        "answer_d6d2eba8_1",
        "answer_d6d2eba8_2",
    )
    with pytest.raises(AdapterError, match="record 2, field 'question_date'"):
        next(convs)
    limited = list(iter_conversations("locomo", str(FIXTURES / "locomo_mini.json"), {1, 2, 3, 4}, 1))
    assert len(limited) == 1 and len(limited[0].questions) > 1  # one conversation, all its questions


def test_bench_on_a_built_haystack_reports_peak_memory(tmp_path):
    from memrl.data.haystack import HaystackSpec, write_haystacks

    out = tmp_path / "s.json"
    write_haystacks(str(FIXTURES / "longmemeval_mini.json"), str(out), HaystackSpec(sessions=3))
    result = BENCHES.get("memory")(["--dataset", "longmemeval", "--path", str(out), "--no-baselines"])
    assert result["questions"] == 2 and result["history_turns"] > 0 and result["peak_rss_mb"] > 100
    assert 0.0 <= result["recall@10"] <= 1.0 and "turn_recall@10" in result
