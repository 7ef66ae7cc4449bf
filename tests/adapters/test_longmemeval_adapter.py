"""LongMemEval adapter on the bundled fixture and (when present) the real oracle file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from memrl.adapters import LONGMEMEVAL_FIXTURE
from memrl.data.adapters import AdapterError, run_adapter
from memrl.types import TurnRole

REAL = Path("/work/shared/data/longmemeval/longmemeval_oracle.json")


def _load(path=LONGMEMEVAL_FIXTURE, split="all", lenient=False, **options):
    return run_adapter("longmemeval", str(path), split=split, lenient=lenient, options=options)


def _raw():
    return json.loads(LONGMEMEVAL_FIXTURE.read_text())


def test_fixture_records_become_episodes():
    raw = _raw()
    episodes, report = _load()
    assert report.skipped == 0 and len(episodes) == 3
    for ep, rec in zip(episodes, raw, strict=True):
        assert ep.final_query == rec["question"] and ep.target.role is TurnRole.TARGET
        assert ep.target.timestamp == rec["question_date"]
        assert ep.target_answer == str(rec["answer"])
        assert ep.metadata["question_type"] == rec["question_type"]
        assert ep.metadata["answer_session_ids"] == rec["answer_session_ids"]
        assert ep.metadata["abstention"] == rec["question_id"].endswith("_abs")
        n_turns = sum(len(s) for s in rec["haystack_sessions"])
        assert len(ep.history) == n_turns
        flagged = [t.turn_id for t in ep.history if t.metadata.get("has_answer")]
        assert ep.metadata["evidence_turn_ids"] == flagged
        for sid, date, session in zip(
            rec["haystack_session_ids"], rec["haystack_dates"], rec["haystack_sessions"], strict=True
        ):
            turns = [t for t in ep.history if t.turn_id.rsplit(":", 1)[0] == sid]
            assert [t.text for t in turns] == [m["content"] for m in session]
            assert [t.speaker for t in turns] == [m["role"] for m in session]
            assert {t.timestamp for t in turns} == {date}
            assert [t.turn_id for t in turns] == [f"{sid}:{i}" for i in range(len(session))]
    assert sum(e.metadata["abstention"] for e in episodes) == 1
    assert any(isinstance(r["answer"], int) for r in raw)  # the numeric answer became text above


def test_sessions_are_ordered_by_date(tmp_path):
    raw = _raw()
    rec = next(r for r in raw if len(r["haystack_sessions"]) >= 2)
    for key in ("haystack_sessions", "haystack_dates", "haystack_session_ids"):
        rec[key] = rec[key][::-1]
    path = tmp_path / "lme.json"
    path.write_text(json.dumps([rec]))
    (ep,), _ = _load(path)
    stamps = [t.timestamp for t in ep.history]
    assert stamps == sorted(stamps) and len(set(stamps)) >= 2
    assert ep.metadata["haystack_dates"] == rec["haystack_dates"]  # file order kept in metadata


def test_list_fields_stored_as_json_text_are_accepted(tmp_path):
    raw = _raw()
    for rec in raw:
        for key in ("haystack_sessions", "haystack_dates", "haystack_session_ids", "answer_session_ids"):
            rec[key] = json.dumps(rec[key])
    path = tmp_path / "lme_str.json"
    path.write_text(json.dumps(raw))
    episodes, _ = _load(path)
    reference, _ = _load()
    assert episodes == reference


def test_train_test_split_by_question(tmp_path):
    recs = []
    for i in range(20):
        for rec in _raw():
            rec["question_id"] = f"{rec['question_id']}-{i}"
            recs.append(rec)
    path = tmp_path / "many.json"
    path.write_text(json.dumps(recs))
    train, _ = _load(path, split="train", test_fraction=0.3)
    test, _ = _load(path, split="test", test_fraction=0.3)
    assert train and test and len(train) + len(test) == 60
    assert {e.episode_id for e in train}.isdisjoint(e.episode_id for e in test)


def test_jsonl_input(tmp_path):
    path = tmp_path / "lme.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in _raw()) + "\n")
    episodes, _ = _load(path)
    assert [e.episode_id for e in episodes] == [e.episode_id for e in _load()[0]]


def test_bad_date_and_length_mismatch_are_located(tmp_path):
    raw = _raw()
    raw[0]["haystack_dates"][0] = "yesterday"
    raw[1]["haystack_session_ids"].append("extra")
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(AdapterError, match=r"record 0, field 'haystack_dates\[0\]'.*2023/05/21"):
        _load(path)
    episodes, report = _load(path, lenient=True)
    assert len(episodes) == 1 and report.skipped == 2
    assert [(e.record, e.field) for e in report.skips] == [(0, "haystack_dates[0]"), (1, "haystack_sessions")]


def test_a_session_repeated_in_one_haystack_is_kept_at_both_dates(tmp_path):
    """The official _s/_m files repeat a session id in one haystack (same session, two dates): strict mode keeps
    both occurrences, the repeat's turn ids carry '#2', and evidence covers both."""
    raw = _raw()
    rec = raw[0]
    j = 0
    rec["haystack_sessions"].append(rec["haystack_sessions"][j])
    rec["haystack_session_ids"].append(rec["haystack_session_ids"][j])
    rec["haystack_dates"].append("2099/01/01 (Thu) 10:00")  # the repeat comes last by date
    path = tmp_path / "repeat.json"
    path.write_text(json.dumps(raw))
    episodes, report = _load(path)
    assert report.skipped == 0 and len(episodes) == len(raw)
    ep = episodes[0]
    sid = rec["haystack_session_ids"][j]
    history = [t for t in ep.turns if t.role is TurnRole.HISTORY]
    ids = [t.turn_id for t in history]
    assert len(ids) == len(set(ids))
    repeat = [t for t in history if t.turn_id.startswith(f"{sid}#2:")]
    first = [t for t in history if t.turn_id.startswith(f"{sid}:")]
    assert [t.text for t in repeat] == [t.text for t in first] and repeat[0].timestamp.startswith(
        "2099/01/01"
    )
    assert history[-len(repeat) :] == repeat
    flagged = [t.turn_id for t in first if t.metadata.get("has_answer")]
    assert set(ep.metadata["evidence_turn_ids"]) >= {*flagged, *(f.replace(":", "#2:", 1) for f in flagged)}
    assert ep.metadata["haystack_session_ids"].count(sid) == 2

    from memrl.bench.memory import _session_ids

    assert _session_ids([repeat[0].turn_id, first[0].turn_id]) == {sid}


@pytest.mark.skipif(not REAL.is_file(), reason="real LongMemEval oracle file not present")
def test_real_oracle_gives_500_episodes():
    episodes, report = _load(REAL)
    assert len(episodes) == 500 and report.skipped == 0
    assert sum(e.metadata["abstention"] for e in episodes) == 30
    assert Counter(e.metadata["question_type"] for e in episodes)["knowledge-update"] == 78
    assert len({e.episode_id for e in episodes}) == 500
    assert all(e.history and e.target.timestamp for e in episodes)
