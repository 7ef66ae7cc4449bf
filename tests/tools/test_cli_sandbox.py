"""``memrl sandbox run FILE.py --json`` prints exactly what the tool's sandbox produced."""

from __future__ import annotations

import json

from memrl.cli.main import main
from tests.tools.support import needs_bwrap


@needs_bwrap
def test_sandbox_run_json(tmp_path, capsys):
    f = tmp_path / "prog.py"
    f.write_text("print('hi')\nraise KeyError('k')\n")
    rc = main(["sandbox", "run", str(f), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 1
    assert set(out) == {"exit_code", "stdout", "stderr", "timed_out", "killed_reason"}
    assert out["exit_code"] == 1 and out["stdout"] == "hi\n" and out["stderr"].endswith("KeyError: 'k'\n")


@needs_bwrap
def test_sandbox_run_json_timeout_with_override(tmp_path, capsys):
    f = tmp_path / "loop.py"
    f.write_text("while True: pass\n")
    main(["sandbox", "run", str(f), "--json", "tools.sandbox.timeout_s=0.3"])
    out = json.loads(capsys.readouterr().out)
    assert out["timed_out"] is True and out["killed_reason"] == "timeout"


def test_sandbox_run_missing_file(capsys):
    assert main(["sandbox", "run", "/nonexistent/x.py", "--json"]) == 2
    assert "is not a file" in capsys.readouterr().err
