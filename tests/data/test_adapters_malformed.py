"""Malformed dataset files: strict mode names file/record/field; lenient mode skips and reports every skip."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.adapters import LOCOMO_FIXTURE, LONGMEMEVAL_FIXTURE
from memrl.data.adapters import AdapterError, run_adapter

N_QA = 8  # QAs in the LoCoMo fixture


def _two_conversations() -> list[dict]:
    """The LoCoMo fixture twice (distinct sample ids): record 1 gets broken, record 0 must survive."""
    conv = json.loads(LOCOMO_FIXTURE.read_text())[0]
    second = json.loads(json.dumps(conv))
    second["sample_id"] = "conv-copy"
    return [conv, second]


def _write(tmp_path: Path, data, name="data.json") -> str:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return str(path)


def _strict_error(adapter: str, path: str, **options) -> AdapterError:
    with pytest.raises(AdapterError) as info:
        run_adapter(adapter, path, split="all", options=options)
    err = info.value
    assert err.file == path and path in str(err)
    return err


def _lenient(adapter: str, path: str, **options):
    return run_adapter(adapter, path, split="all", lenient=True, options=options)


def _break_missing_question(convs):
    del convs[1]["qa"][2]["question"]
    return 1, "qa[2].question", "missing", N_QA * 2 - 1


def _break_category_type(convs):
    convs[1]["qa"][0]["category"] = "two"
    return 1, "qa[0].category", "integer", N_QA * 2 - 1


def _break_session_type(convs):
    convs[1]["conversation"]["session_2"] = {"not": "a list"}
    return 1, "conversation.session_2", "JSON array", N_QA


def _break_empty_session(convs):
    convs[1]["conversation"]["session_1"] = []
    return 1, "conversation.session_1", "non-empty", N_QA


def _break_missing_date(convs):
    del convs[1]["conversation"]["session_2_date_time"]
    return 1, "conversation.session_2_date_time", "missing", N_QA


def _break_turn_text_type(convs):
    convs[0]["conversation"]["session_1"][4]["text"] = 42
    return 0, "conversation.session_1[4].text", "string", N_QA


@pytest.mark.parametrize(
    "breaker",
    [
        _break_missing_question,
        _break_category_type,
        _break_session_type,
        _break_empty_session,
        _break_missing_date,
        _break_turn_text_type,
    ],
)
def test_locomo_bad_records_strict_and_lenient(tmp_path, breaker):
    convs = _two_conversations()
    record, field, expectation, survivors = breaker(convs)
    path = _write(tmp_path, convs)
    err = _strict_error("locomo", path)
    assert (err.record, err.field) == (record, field)
    assert f"record {record}" in str(err) and repr(field) in str(err) and expectation in str(err)
    episodes, report = _lenient("locomo", path)
    assert len(episodes) == survivors
    assert report.skipped == 1
    assert (report.skips[0].record, report.skips[0].field) == (record, field)


def test_non_utf8_bytes_are_pinned_to_record_and_field(tmp_path):
    convs = _two_conversations()
    convs[1]["conversation"]["session_2"][3]["text"] = "MARKER"
    blob = json.dumps(convs).encode().replace(b"MARKER", b"caf\xe9 \xff")
    path = _write(tmp_path, blob)
    err = _strict_error("locomo", path)
    assert (err.record, err.field) == (1, "conversation.session_2[3].text")
    assert "UTF-8" in str(err) and "0xe9" in str(err)
    episodes, report = _lenient("locomo", path)
    assert len(episodes) == N_QA and report.skipped == 1


@pytest.mark.parametrize("cut_fraction", [0.75, 0.999])
def test_truncated_json_keeps_complete_records(tmp_path, cut_fraction):
    blob = json.dumps(_two_conversations()).encode()
    path = _write(tmp_path, blob[: int(len(blob) * cut_fraction)])
    err = _strict_error("locomo", path)
    assert err.record == 1 and "truncated" in str(err)
    episodes, report = _lenient("locomo", path)
    assert len(episodes) == N_QA  # record 0 was complete before the cut
    assert report.skipped == 1 and report.skips[0].record == 1


def test_truncated_after_last_record(tmp_path):
    blob = json.dumps(_two_conversations()).encode().rstrip(b"]")
    path = _write(tmp_path, blob)
    err = _strict_error("locomo", path)
    assert "',' or ']'" in str(err) and "end of file" in str(err)
    episodes, report = _lenient("locomo", path)
    assert len(episodes) == 2 * N_QA and report.skipped == 1


def test_ten_megabyte_turn_is_rejected_with_reason_or_accepted_when_allowed(tmp_path):
    convs = _two_conversations()
    huge = "x" * (10 * 1024 * 1024)
    convs[1]["conversation"]["session_1"][0]["text"] = huge
    path = _write(tmp_path, convs)
    err = _strict_error("locomo", path)
    assert err.field == "conversation.session_1[0].text"
    assert "max_turn_chars" in str(err) and str(len(huge)) in str(err)
    episodes, report = _lenient("locomo", path)
    assert len(episodes) == N_QA and report.skipped == 1
    allowed, report = run_adapter("locomo", path, split="all", options={"max_turn_chars": 11 * 1024 * 1024})
    assert len(allowed) == 2 * N_QA and report.skipped == 0
    assert max(len(t.text) for t in allowed[-1].history) == len(huge)


def test_longmemeval_malformed_records(tmp_path):
    recs = json.loads(LONGMEMEVAL_FIXTURE.read_text())
    del recs[0]["answer"]
    recs[1]["haystack_sessions"][0] = []
    recs[2]["haystack_sessions"][0][0]["content"] = ["not", "text"]
    path = _write(tmp_path, recs)
    err = _strict_error("longmemeval", path)
    assert (err.record, err.field) == (0, "answer") and "missing" in str(err)
    episodes, report = _lenient("longmemeval", path)
    assert episodes == [] and report.skipped == 3
    assert [(s.record, s.field) for s in report.skips] == [
        (0, "answer"),
        (1, "haystack_sessions[0]"),
        (2, "haystack_sessions[0][0].content"),
    ]
    assert all(d["message"] for d in report.to_dicts()) and len(report.reasons()) == 3


@pytest.mark.parametrize(
    ("blob", "needle"),
    [
        (b'{"not": "an array"}', "JSON array of records"),
        (b"", "JSON array of records"),
        (b"[1, 2]", "JSON object"),
    ],
)
def test_wrong_top_level_shapes(tmp_path, blob, needle):
    path = _write(tmp_path, blob)
    err = _strict_error("longmemeval", path)
    assert needle in str(err)


def test_missing_file_is_an_adapter_error(tmp_path):
    err = _strict_error("locomo", str(tmp_path / "absent.json"))
    assert "no such file" in str(err)
