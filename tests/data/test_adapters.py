"""Adapter registry, option checking, load_dataset, JSON record reading and the error/skip types."""

from __future__ import annotations

import json

import pytest

from memrl.adapters import LOCOMO_FIXTURE
from memrl.data.adapters import (
    ADAPTERS,
    AdapterError,
    SkipReport,
    in_split,
    iter_json_records,
    load_dataset,
    record_guard,
    run_adapter,
)
from memrl.data.config import DataConfig
from memrl.registry import RegistryError
from memrl.types import BatchInput


def test_builtin_adapters_registered():
    assert {"synthetic", "locomo", "longmemeval"} <= set(ADAPTERS.names())


def test_unknown_adapter_lists_valid_choices():
    with pytest.raises(RegistryError, match="valid choices: .*locomo.*longmemeval.*synthetic"):
        run_adapter("locomoo", str(LOCOMO_FIXTURE))


def test_dotted_path_adapter():
    episodes, _ = run_adapter("memrl.adapters.synthetic:synthetic", None, options={"num_episodes": 3})
    assert len(episodes) == 3 and all(isinstance(e, BatchInput) for e in episodes)


def test_unknown_option_is_rejected_with_valid_ones():
    with pytest.raises(ValueError, match=r"no option\(s\) \['num_episode'\]; valid options: .*num_episodes"):
        run_adapter("synthetic", None, options={"num_episode": 3})
    with pytest.raises(ValueError, match="test_fraction"):
        run_adapter("locomo", str(LOCOMO_FIXTURE), options={"fraction": 0.2})


def test_bad_split_rejected():
    with pytest.raises(ValueError, match="split must be one of"):
        run_adapter("synthetic", None, split="dev", options={"num_episodes": 1})
    with pytest.raises(ValueError, match="no validation split"):  # only datasets that define one have it
        run_adapter("synthetic", None, split="validation", options={"num_episodes": 1})


def test_load_dataset_honours_limit_split_and_options():
    cfg = DataConfig(adapter="synthetic", split="test", limit=5, options={"num_episodes": 12, "seed": 3})
    episodes, report = load_dataset(cfg)
    assert len(episodes) == 5 and report.skipped == 0
    assert all(e.metadata["split"] == "test" and e.metadata["seed"] == 3 for e in episodes)
    full, _ = load_dataset(
        DataConfig(adapter="synthetic", split="test", options={"num_episodes": 12, "seed": 3})
    )
    assert full[:5] == episodes and len(full) == 12
    cfg = DataConfig(adapter="locomo", path=str(LOCOMO_FIXTURE), split="all", limit=3)
    assert len(load_dataset(cfg)[0]) == 3


def test_load_dataset_lenient_reports_skips(tmp_path):
    convs = json.loads(LOCOMO_FIXTURE.read_text())
    convs[0]["qa"][1]["answer"] = {"nested": True}
    path = tmp_path / "l.json"
    path.write_text(json.dumps(convs))
    with pytest.raises(AdapterError, match=r"record 0, field 'qa\[1\].answer': expected a string or number"):
        load_dataset(DataConfig(adapter="locomo", path=str(path), split="all"))
    episodes, report = load_dataset(DataConfig(adapter="locomo", path=str(path), split="all", lenient=True))
    assert len(episodes) == 7 and report.skipped == 1
    assert report.to_dicts()[0]["field"] == "qa[1].answer"


def test_adapter_error_message_and_dict():
    err = AdapterError("f.json", 4, "qa[2].answer", "a string", "array [1]")
    assert str(err) == "f.json, record 4, field 'qa[2].answer': expected a string; got array [1]"
    assert err.to_dict()["record"] == 4 and err.to_dict()["message"] == str(err)
    assert str(AdapterError("f.json", None, None, "a JSON array")) == "f.json: expected a JSON array"


def test_record_guard_strict_raises_lenient_records():
    report = SkipReport()
    with pytest.raises(AdapterError), record_guard(report, lenient=False):
        raise AdapterError("f", 0, "x", "y")
    with record_guard(report, lenient=True):
        raise AdapterError("f", 1, "x", "y")
    assert report.skipped == 1 and report.reasons() == ["f, record 1, field 'x': expected y"]
    with pytest.raises(KeyError), record_guard(report, lenient=True):
        raise KeyError("a bug is not a data error and is never swallowed")


def test_iter_json_records_empty_array_and_jsonl_bad_line(tmp_path):
    empty = tmp_path / "e.json"
    empty.write_text("  [ ]\n")
    assert list(iter_json_records(str(empty), lenient=False, report=SkipReport())) == []
    lines = tmp_path / "x.jsonl"
    lines.write_text('{"a": 1}\n{"a": \n\n{"a": 3}\n')
    report = SkipReport()
    assert list(iter_json_records(str(lines), lenient=True, report=report)) == [(0, {"a": 1}), (2, {"a": 3})]
    assert report.skipped == 1 and report.skips[0].record == 1 and "line 2" in str(report.skips[0])
    with pytest.raises(AdapterError, match="record 1"):
        list(iter_json_records(str(lines), lenient=False, report=SkipReport()))


def test_in_split_partitions_deterministically():
    keys = [f"k{i}" for i in range(400)]
    test = {k for k in keys if in_split(k, "test", 0.25)}
    train = {k for k in keys if in_split(k, "train", 0.25)}
    assert test.isdisjoint(train) and test | train == set(keys)
    assert 60 < len(test) < 140
    assert test == {k for k in keys if in_split(k, "test", 0.25)}
    assert all(in_split(k, "all", 0.25) for k in keys)
    assert not any(in_split(k, "test", 0.0) for k in keys)
    with pytest.raises(ValueError, match="test_fraction"):
        in_split("k", "test", 1.5)


def test_data_config_rejects_bad_split_and_limit():
    with pytest.raises(ValueError, match="data.split='val'; valid: train, validation"):
        DataConfig(split="val")
    with pytest.raises(ValueError, match="data.limit"):
        DataConfig(limit=-1)


def test_utf8_bom_is_tolerated(tmp_path):
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + LOCOMO_FIXTURE.read_bytes())
    episodes, report = run_adapter("locomo", str(path), split="all")
    assert len(episodes) == 8 and report.skipped == 0
