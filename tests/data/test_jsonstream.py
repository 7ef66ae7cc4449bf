import json
import tracemalloc

import pytest

from memrl.data.jsonstream import JSONStreamError, iter_json_array, iter_json_lines

RECORDS = [
    {"q": "Où est né Zoë? 🙂", "n": 1.5e3, "nested": [{"k": None}, True, 'tab\tquote"back\\slash']},
    "plain string élément",
    12345678901234567890,
    [],
    {"esc": "\u00e9\u4e2d\u6587", "empty": {}},
]


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 7, 64, 1 << 20])
def test_every_chunk_size_reads_the_same_records(tmp_path, chunk):
    # Multi-byte characters and escapes land on chunk boundaries for the small sizes.
    for ensure_ascii in (True, False):
        path = tmp_path / f"a{ensure_ascii}.json"
        path.write_text("\ufeff" + json.dumps(RECORDS, ensure_ascii=ensure_ascii, indent=1), encoding="utf-8")
        assert [r for _, r in iter_json_array(path, chunk_chars=chunk)] == RECORDS


def test_memory_holds_about_one_record(tmp_path):
    path = tmp_path / "big.json"
    records = [{"id": i, "text": f"turn {i} " + "x" * 10_000} for i in range(400)]  # ~4 MB
    path.write_text(json.dumps(records))
    tracemalloc.start()
    try:
        count = sum(1 for _ in iter_json_array(path, chunk_chars=1 << 15))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 400
    assert peak < path.stat().st_size / 20  # reading it whole would peak above the file size


def test_truncated_file_yields_the_complete_records_first(tmp_path):
    blob = json.dumps(RECORDS)
    path = tmp_path / "cut.json"
    path.write_text(blob[: blob.index("plain") + 3])
    seen = []
    with pytest.raises(JSONStreamError) as info:
        for index, record in iter_json_array(path, chunk_chars=4):
            seen.append((index, record))
    assert seen == [(0, RECORDS[0])]
    err = info.value
    assert err.index == 1 and err.truncated and "truncated" in str(err)


def test_malformed_record_fails_at_its_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('[{"a": 1},\n {"a": 2 "b": 3},\n' + ",\n".join(['{"pad": 0}'] * 5000) + "]")
    with pytest.raises(JSONStreamError) as info:
        list(iter_json_array(path, chunk_chars=16))
    err = info.value
    assert err.index == 1 and not err.truncated
    assert "line 2" in err.got and "delimiter" in err.got


@pytest.mark.parametrize("text, got", [("", "an empty file"), ('{"a": 1}', "'{\"a\": 1}'")])
def test_not_an_array(tmp_path, text, got):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(JSONStreamError, match="JSON array") as info:
        list(iter_json_array(path))
    assert info.value.got == got and info.value.index is None


def test_missing_separator_after_the_last_record(tmp_path):
    path = tmp_path / "open.json"
    path.write_text('[{"a": 1}, {"a": 2}')
    with pytest.raises(JSONStreamError, match="',' or ']'") as info:
        list(iter_json_array(path, chunk_chars=3))
    assert info.value.index == 2 and info.value.truncated


def test_json_lines_report_bad_lines_in_place(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"a": 1}\n\nnot json\n{"a": 2}\n', encoding="utf-8")
    rows = list(iter_json_lines(path))
    assert [(i, n) for i, n, _ in rows] == [(0, 1), (1, 3), (2, 4)]
    assert rows[0][2] == {"a": 1} and isinstance(rows[1][2], json.JSONDecodeError) and rows[2][2] == {"a": 2}
