"""``memrl data check`` / ``memrl data show`` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.adapters import LOCOMO_FIXTURE, LONGMEMEVAL_FIXTURE
from memrl.cli.data import parse_options
from memrl.cli.main import main

REAL_LOCOMO = Path("/work/shared/data/locomo/locomo10.json")
REAL_LME = Path("/work/shared/data/longmemeval/longmemeval_oracle.json")


def _check(capsys, *argv) -> tuple[int, dict]:
    code = main(["data", "check", *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_check_fixtures(capsys):
    assert _check(capsys, "locomo", str(LOCOMO_FIXTURE)) == (0, {"episodes": 8, "skipped": 0, "errors": []})
    assert _check(capsys, "longmemeval", str(LONGMEMEVAL_FIXTURE)) == (
        0,
        {"episodes": 3, "skipped": 0, "errors": []},
    )


def test_check_synthetic_with_options(capsys):
    code, out = _check(capsys, "synthetic", "-", "--option", "num_episodes=7", "--split", "test")
    assert (code, out["episodes"]) == (0, 7)
    code, out = _check(
        capsys, "synthetic", "--option", "num_episodes=4", "--option", 'question_types=["lookup"]'
    )
    assert (code, out["episodes"]) == (0, 8)  # split defaults to all = train + test


def test_check_strict_failure_and_lenient(capsys, tmp_path):
    convs = json.loads(LOCOMO_FIXTURE.read_text())
    del convs[0]["qa"][0]["question"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(convs))
    code, out = _check(capsys, "locomo", str(path))
    assert code == 1 and out["episodes"] == 0
    (err,) = out["errors"]
    assert (err["file"], err["record"], err["field"]) == (str(path), 0, "qa[0].question")
    code, out = _check(capsys, "locomo", str(path), "--lenient")
    assert (code, out["episodes"], out["skipped"]) == (0, 7, 1)
    assert "qa[0].question" in out["errors"][0]["message"]


def test_check_usage_errors(capsys):
    assert main(["data", "check", "nope", "x"]) == 2
    assert "valid choices" in capsys.readouterr().err
    assert main(["data", "check", "synthetic", "--option", "oops=1"]) == 2
    assert "valid options" in capsys.readouterr().err
    assert main(["data", "check", "synthetic", "--option", "novalue"]) == 2


def test_human_output_and_show(capsys):
    assert main(["data", "check", "locomo", str(LOCOMO_FIXTURE)]) == 0
    assert "episodes: 8  skipped: 0" in capsys.readouterr().out
    assert main(["data", "show", "synthetic", "--index", "1", "--option", "num_episodes=2"]) == 0
    shown = capsys.readouterr().out
    assert "target" in shown and "answer:" in shown and "question_type" in shown
    assert main(["data", "show", "synthetic", "--index", "9", "--option", "num_episodes=2"]) == 2


def test_parse_options_types():
    assert parse_options(["a=3", "b=0.5", "c=true", "d=hello", 'e=["x"]']) == {
        "a": 3,
        "b": 0.5,
        "c": True,
        "d": "hello",
        "e": ["x"],
    }


@pytest.mark.skipif(not REAL_LOCOMO.is_file(), reason="real LoCoMo file not present")
def test_check_real_locomo(capsys):
    assert _check(capsys, "locomo", str(REAL_LOCOMO)) == (0, {"episodes": 1986, "skipped": 0, "errors": []})


@pytest.mark.skipif(not REAL_LME.is_file(), reason="real LongMemEval file not present")
def test_check_real_longmemeval(capsys):
    assert _check(capsys, "longmemeval", str(REAL_LME)) == (0, {"episodes": 500, "skipped": 0, "errors": []})
