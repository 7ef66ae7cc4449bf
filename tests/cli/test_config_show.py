"""``memrl config show``: the resolved config with each key's source file."""

from __future__ import annotations

from memrl.cli.main import main


def test_show_prints_each_key_with_its_source(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text("seed: 1\nrollout:\n  n: 8\n  temperature: 0.5\n")
    arm = tmp_path / "arm.yaml"
    arm.write_text("defaults: [base.yaml]\nrollout:\n  n: 4\n")
    assert main(["config", "show", str(arm), "rollout.temperature=0.9"]) == 0
    lines = capsys.readouterr().out.splitlines()
    by_key = {line.split(":")[0].strip(): line for line in lines}
    assert by_key["seed"].startswith("seed: 1") and by_key["seed"].endswith("base.yaml")
    assert by_key["n"].startswith("  n: 4") and by_key["n"].endswith("arm.yaml")
    assert by_key["temperature"].endswith("# override") and "0.9" in by_key["temperature"]
    assert "rollout:" in lines and "policy:" not in lines  # only what a layer sets


def test_show_all_adds_defaults_with_their_tier(tmp_path, capsys):
    from memrl.config_knobs import EXPERIMENT

    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\n")
    assert main(["config", "show", str(path), "--all"]) == 0
    out = capsys.readouterr().out
    assert "policy:" in out and "# default" in out
    experiment = next(iter(EXPERIMENT))
    leaf = experiment.rsplit(".", 1)[1]
    line = next(line for line in out.splitlines() if line.strip().startswith(f"{leaf}:"))
    assert "[experiment]" in line


def test_show_reports_a_bad_config_in_one_line(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("rollout:\n  nn: 8\n")
    assert main(["config", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert "c.yaml: unknown config key 'rollout.nn'" in err
