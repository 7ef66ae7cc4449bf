"""``memrl bench``: each bench's own help, the list of benches, and a clear error for an unknown name."""

from __future__ import annotations

import pytest

from memrl.bench import BENCH_MODULES
from memrl.cli.main import main


@pytest.mark.parametrize("name", BENCH_MODULES)
def test_bench_name_help_lists_that_bench_s_options(name, capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", name, "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and out.startswith(f"usage: memrl bench {name}")
    assert "benchmark name:" not in out  # not the generic `memrl bench` help


def test_batch_help_shows_its_own_options(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "batch", "-h"])
    out = capsys.readouterr().out
    assert "--layers" in out and "--threads" in out


def test_bench_help_without_a_name_lists_the_benches(capsys):
    assert main(["bench", "--help"]) == 0
    assert "batch, memory, policy" in capsys.readouterr().out
    assert main(["bench"]) == 2


def test_an_unknown_bench_is_a_usage_error_listing_the_benches(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "nope"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "unknown benchmark 'nope'" in err and "batch" in err
