"""Torch threads from the machine's load, with MEMRL_THREADS / OMP_NUM_THREADS as the user's override."""

from __future__ import annotations

import logging

import pytest
import torch

from memrl import threads
from memrl.threads import choose_threads


@pytest.mark.parametrize(
    ("load", "cores", "expected"),
    [
        (0.0, 2, 2),  # quiet: every core
        (0.4, 2, 2),
        (1.0, 2, 1),  # another job keeps a core busy: torch's 2 threads would wait on each other
        (1.4, 2, 1),
        (5.0, 2, 1),  # oversubscribed: never fewer than one
        (4.0, 16, 12),  # the cores left idle
        (0.0, 1, 1),
    ],
)
def test_the_load_leaves_idle_cores_for_torch(load, cores, expected):
    n, why = choose_threads(env={}, load=load, cores=cores)
    assert n == expected and f"load {load:.2f} on {cores} cores" in why and "MEMRL_THREADS" in why


def test_memrl_threads_then_omp_num_threads_override_the_load():
    assert choose_threads(env={"MEMRL_THREADS": "3", "OMP_NUM_THREADS": "1"}, load=9.0, cores=2) == (
        3,
        "MEMRL_THREADS=3",
    )
    assert choose_threads(env={"OMP_NUM_THREADS": "1"}, load=0.0, cores=8) == (1, "OMP_NUM_THREADS=1")
    assert choose_threads(env={"OMP_NUM_THREADS": "4,2"}, load=0.0, cores=8)[0] == 4  # per nesting level
    assert choose_threads(env={"OMP_NUM_THREADS": ""}, load=0.0, cores=8)[0] == 8
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match=rf"MEMRL_THREADS='{bad}': expected a whole number"):
            choose_threads(env={"MEMRL_THREADS": bad})


def test_model_commands_set_and_log_the_threads_once(monkeypatch, caplog, tmp_path):
    """`memrl run/eval/train/bench` choose before any work: a busy machine gets one thread."""
    from memrl.cli.main import main

    monkeypatch.delenv("MEMRL_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "busy_cores", lambda: 3.0)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with caplog.at_level(logging.INFO, logger="memrl.threads"):
            main(["train", "--config", "configs/no_such.yaml"])  # fails after the choice: no model runs
        assert torch.get_num_threads() == 1
        assert [r.getMessage() for r in caplog.records] == [
            "torch threads: 1 (load 3.00 on 2 cores; set MEMRL_THREADS to choose)"
        ]
    finally:
        torch.set_num_threads(before)


def test_a_malformed_override_is_a_usage_error(monkeypatch, capsys):
    from memrl.cli.main import main

    monkeypatch.setenv("MEMRL_THREADS", "lots")
    with pytest.raises(SystemExit) as info:
        main(["eval", "--config", "configs/synthetic.yaml"])
    assert info.value.code == 2 and "MEMRL_THREADS='lots'" in capsys.readouterr().err


def test_busy_cores_reads_the_cpu_time_of_the_last_moment_not_the_lagging_load_average(monkeypatch):
    """A job that ended a second ago still holds the 1-minute load average at ~1: the next job must see the cores
    as they are now."""
    samples = iter([(1000.0, 4000.0), (1050.0, 4100.0)])  # 50 of 100 jiffies busy over the window
    monkeypatch.setattr(threads, "_cpu_times", lambda: next(samples))
    monkeypatch.setattr(threads, "load_average", lambda: 1.9)
    assert threads.busy_cores(window_s=0.0, cores=2) == pytest.approx(1.0)
    monkeypatch.setattr(threads, "_cpu_times", lambda: None)  # no /proc/stat: the load average
    assert threads.busy_cores(window_s=0.0, cores=2) == 1.9
    real = threads.busy_cores(window_s=0.05)  # this machine, for real
    assert 0.0 <= real <= (threads.os.cpu_count() or 1) + 1e-6
