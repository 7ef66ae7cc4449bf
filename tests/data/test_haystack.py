"""``memrl data haystack``: LongMemEval _S-like haystacks from an oracle file, read back by the real adapter."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from memrl.adapters import LONGMEMEVAL_FIXTURE
from memrl.cli.main import main
from memrl.data.adapters import AdapterError, run_adapter
from memrl.data.haystack import DATE_FORMAT, HaystackSpec, spread, write_haystacks

REAL_ORACLE = Path("/work/shared/data/longmemeval/longmemeval_oracle.json")


def _build(tmp_path, oracle=LONGMEMEVAL_FIXTURE, name="s.json", **spec) -> tuple[dict, list[dict]]:
    out = tmp_path / name
    summary = write_haystacks(str(oracle), str(out), HaystackSpec(**spec))
    return summary, json.loads(out.read_text())


def test_fixture_haystacks_hide_evidence_among_other_questions_sessions(tmp_path):
    oracle = {r["question_id"]: r for r in json.loads(LONGMEMEVAL_FIXTURE.read_text())}
    summary, records = _build(tmp_path, sessions=50)
    # 4 distinct sessions in the fixture: every haystack holds its own plus all the others' (the pool runs out)
    assert (summary["questions"], summary["sessions_min"], summary["sessions_max"]) == (3, 4, 4)
    for rec in records:
        src = oracle[rec["question_id"]]
        assert [k for k in rec] == list(src)  # official field order
        assert {k: rec[k] for k in ("question", "answer", "question_date", "answer_session_ids")} == {
            k: src[k] for k in ("question", "answer", "question_date", "answer_session_ids")
        }
        by_id = dict(zip(rec["haystack_session_ids"], rec["haystack_sessions"], strict=True))
        dates = dict(zip(rec["haystack_session_ids"], rec["haystack_dates"], strict=True))
        for sid, session, date in zip(
            src["haystack_session_ids"], src["haystack_sessions"], src["haystack_dates"], strict=True
        ):
            assert by_id[sid] == session and dates[sid] == date  # evidence kept as is, flags and date
        filler = [sid for sid in by_id if sid not in src["haystack_session_ids"]]
        assert filler and all(not t.get("has_answer") for sid in filler for t in by_id[sid])
        parsed = [dt.datetime.strptime(d, DATE_FORMAT) for d in rec["haystack_dates"]]
        assert parsed == sorted(parsed)
        assert parsed[-1] <= dt.datetime.strptime(rec["question_date"], DATE_FORMAT)
    episodes, report = run_adapter("longmemeval", str(tmp_path / "s.json"), split="all")
    assert (len(episodes), report.skipped) == (3, 0)
    gold = {e.metadata["question_id"]: e.metadata["evidence_turn_ids"] for e in episodes}
    assert gold["0f05491a"]  # has_answer turns survive the rebuild


def test_deterministic_and_spec_changes_the_draw(tmp_path):
    _, a = _build(tmp_path, name="a.json", sessions=3)
    _, b = _build(tmp_path, name="b.json", sessions=3)
    _, c = _build(tmp_path, name="c.json", sessions=3, seed=1)
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    assert [r["haystack_dates"] for r in a] != [r["haystack_dates"] for r in c]
    assert [len(r["haystack_session_ids"]) for r in a] == [3, 3, 3]
    _, d = _build(tmp_path, name="d.json", sessions=1)
    assert [len(r["haystack_session_ids"]) for r in d] == [2, 1, 1]  # evidence is never dropped


def test_an_abstention_twin_never_fills_its_question(tmp_path):
    records = json.loads(LONGMEMEVAL_FIXTURE.read_text())
    twin = json.loads(json.dumps(records[1]))
    twin["question_id"] += "_abs"
    twin["haystack_session_ids"] = ["twin_session"]
    (tmp_path / "o.json").write_text(json.dumps([*records, twin]))
    _, out = _build(tmp_path, oracle=tmp_path / "o.json", sessions=50)
    ids = {r["question_id"]: r["haystack_session_ids"] for r in out}
    assert "twin_session" not in ids["bcbe585f"] and "answer_43ba3965_1" not in ids["bcbe585f_abs"]
    assert "twin_session" in ids["0f05491a"]


def test_bad_oracle_fails_naming_record_and_field(tmp_path):
    records = json.loads(LONGMEMEVAL_FIXTURE.read_text())
    records[2]["haystack_dates"] = ["yesterday"]
    (tmp_path / "bad.json").write_text(json.dumps(records))
    with pytest.raises(AdapterError, match=r"record 2, field 'haystack_dates\[0\]'"):
        _build(tmp_path, oracle=tmp_path / "bad.json")
    assert not (tmp_path / "s.json").exists()
    with pytest.raises(ValueError, match="sessions=0"):
        HaystackSpec(sessions=0)


def test_spread_covers_the_whole_file():
    assert spread(10, 3) == [0, 3, 6]
    assert spread(4, None) == spread(4, 9) == [0, 1, 2, 3]


def test_cli(tmp_path, capsys):
    out = tmp_path / "cli.json"
    code = main(
        ["data", "haystack", "--oracle", str(LONGMEMEVAL_FIXTURE), "--out", str(out), "--questions", "2"]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["questions"] == 2
    assert main(["data", "haystack", "--oracle", str(tmp_path / "missing.json"), "--out", str(out)]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["data", "haystack", "--oracle", "x", "--out", str(out), "--sessions", "0"]) == 2


@pytest.mark.skipif(not REAL_ORACLE.is_file(), reason="needs the LongMemEval oracle file")
def test_real_oracle_gives_fifty_session_haystacks(tmp_path):
    summary, records = _build(tmp_path, oracle=REAL_ORACLE, sessions=50, questions=6)
    assert (summary["questions"], summary["sessions_min"], summary["sessions_max"]) == (6, 50, 50)
    assert len({r["question_type"] for r in records}) >= 3  # spread over the type-grouped file
    episodes, report = run_adapter("longmemeval", str(tmp_path / "s.json"), split="all")
    assert (len(episodes), report.skipped) == (6, 0)
