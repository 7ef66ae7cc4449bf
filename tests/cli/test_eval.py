"""``memrl eval`` prints a table and the report's path; ``--json`` prints the report as JSON."""

from __future__ import annotations

import json

import pytest

from memrl.cli.main import main
from memrl.episode import evaluate as evaluate_module
from tests.episode.test_report_table import REAL_EVAL


@pytest.fixture
def fake_eval(monkeypatch):
    """``evaluate_ablations`` answers with a real eval.json at once (the table and JSON output are under test)."""
    report = json.loads(REAL_EVAL.read_text())
    seen = []

    def fake(cfg, out_dir, progress=True):
        seen.append(out_dir)
        return report

    monkeypatch.setattr(evaluate_module, "evaluate_ablations", fake)
    return report, seen


def test_eval_prints_a_table_and_the_report_path(fake_eval, tmp_path, capsys):
    _, seen = fake_eval
    rc = main(["eval", "--config", "configs/synthetic.yaml", "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0 and seen == [tmp_path]
    assert out.splitlines()[1].split()[:3] == ["arm", "episodes", "strict"]
    assert out.rstrip().splitlines()[-1] == f"full report: {tmp_path / 'eval.json'}"
    assert len(out.splitlines()) < 30 and "{" not in out


def test_eval_json_prints_the_whole_report(fake_eval, tmp_path, capsys):
    report, _ = fake_eval
    rc = main(["eval", "--config", "configs/synthetic.yaml", "--output-dir", str(tmp_path), "--json"])
    assert rc == 0 and json.loads(capsys.readouterr().out) == report
