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


def test_a_long_command_takes_the_cores_back_when_another_job_ends(monkeypatch, caplog):
    """Between phases the count follows the others' load: down while a job keeps a core busy, back up once it
    ends, logged at each change and quiet when nothing moves; no reading keeps the count."""
    loads = iter([1.0, 1.2, None, 0.1, 0.0, 1.0])
    follower = threads.ThreadFollower(load=lambda: next(loads), env={}, cores=2)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with caplog.at_level(logging.INFO, logger="memrl.threads"):
            seen = [follower.check(f"training step {k}") for k in range(1, 7)]
        assert seen == [1, 1, 1, 2, 2, 1] and torch.get_num_threads() == 1
        assert [r.getMessage() for r in caplog.records] == [
            "torch threads: 2 -> 1 before training step 1 (load 1.00 on 2 cores; set MEMRL_THREADS to choose)",
            "torch threads: 1 -> 2 before training step 4 (load 0.10 on 2 cores; set MEMRL_THREADS to choose)",
            "torch threads: 2 -> 1 before training step 6 (load 1.00 on 2 cores; set MEMRL_THREADS to choose)",
        ]
        assert follower.changes == 3
    finally:
        torch.set_num_threads(before)


def test_an_override_pins_the_count_whatever_the_load():
    follower = threads.ThreadFollower(load=lambda: 0.0, env={"MEMRL_THREADS": "1"}, cores=8)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert [follower.check("evaluation batch 1") for _ in range(3)] == [1, 1, 1]
        assert follower.changes == 0
    finally:
        torch.set_num_threads(before)


def test_others_load_leaves_out_this_process_and_waits_for_a_long_enough_interval(monkeypatch):
    """Busy CPU time of the whole machine less this process's own, over the wall time since the last reading
    (the jiffies of all CPUs / cores); a reading under ``min_interval_s`` after the last returns None and the
    next one averages over the whole interval."""
    machine = iter([(0.0, 0.0), (10.0, 20.0), (400.0, 800.0), (600.0, 1200.0)])  # (busy, total) jiffies
    own = iter([0.0, 0.05, 2.0, 4.0])  # this process's CPU seconds
    monkeypatch.setattr(threads, "_cpu_times", lambda: next(machine))
    monkeypatch.setattr(threads, "_self_cpu_s", lambda: next(own))
    load = threads.OthersLoad(cores=2, min_interval_s=1.0)
    load.jiffy_s = 0.01
    assert load() is None  # 20 jiffies over 2 CPUs: 0.1 s, too short
    # 800 jiffies = 4 s of wall on 2 CPUs; 4 busy CPU-seconds of which 2 are this process's: 0.5 cores
    assert load() == pytest.approx(0.5)
    # then 2 s of wall: 2 busy CPU-seconds, all this process's: the others are idle
    assert load() == pytest.approx(0.0)


def test_follow_threads_acts_only_for_the_commands_that_ask(monkeypatch):
    """Library callers (and tests) keep the threads they set; `memrl train` follows until it returns."""
    from memrl.cli.main import main

    threads.stop_following()
    assert threads.follow_threads("training step 1") is None
    monkeypatch.setenv("MEMRL_THREADS", "1")
    seen = {}
    import memrl.cli.bench as cli_bench
    import memrl.cli.train as cli_train

    for module in (cli_train, cli_bench):
        monkeypatch.setattr(module, "run", lambda args: seen.update({args.command: threads._FOLLOWER}) or 0)
    before = torch.get_num_threads()
    try:
        main(["train", "--config", "configs/synthetic.yaml"])
        assert isinstance(seen["train"], threads.ThreadFollower)
        assert threads._FOLLOWER is None  # stopped when the command returned
        main(["bench", "lora"])  # a bench measures at one thread count: it does not follow
        assert seen["bench"] is None
    finally:
        torch.set_num_threads(before)


def test_memrl_train_checks_between_its_phases(tmp_path, tiny_model_dir, monkeypatch, caplog):
    """A real (tiny) `memrl train`: the count is chosen again before each evaluation batch and training step,
    and the change is logged with the phase it came before."""
    from memrl.cli.main import main
    from tests.cli.test_train import CONFIG

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("MEMRL_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "busy_cores", lambda: 0.0)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    phases: list[str] = []
    loads = iter([1.0])  # a job busy during the first phase, gone after it

    class Scripted:
        def __call__(self):
            return next(loads, 0.0)

    monkeypatch.setattr(threads, "OthersLoad", Scripted)
    check = threads.ThreadFollower.check
    monkeypatch.setattr(
        threads.ThreadFollower, "check", lambda self, phase: phases.append(phase) or check(self, phase)
    )
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        CONFIG.format(out=tmp_path / "run", model=tiny_model_dir).replace(
            "final_eval_episodes: 0", "final_eval_episodes: 2"
        )
    )
    before = torch.get_num_threads()
    try:
        with caplog.at_level(logging.INFO, logger="memrl.threads"):
            assert main(["train", "--config", str(cfg), "--no-progress", "train.steps=2"]) == 0
    finally:
        torch.set_num_threads(before)
    # Inside each episode batch it checks again before its memory writes and before answering (runner).
    inner = ["memory writes", "answering"]
    assert phases == [
        "evaluation batch 1", *inner,
        "training step 1", *inner,
        "training step 2", *inner,
        "the final evaluation",
        "evaluation batch 1", *inner,
    ]  # fmt: skip
    changes = [r.getMessage() for r in caplog.records if "->" in r.getMessage()]
    assert changes == [
        "torch threads: 2 -> 1 before evaluation batch 1 (load 1.00 on 2 cores; set MEMRL_THREADS to choose)",
        "torch threads: 1 -> 2 before memory writes (load 0.00 on 2 cores; set MEMRL_THREADS to choose)",
    ]


def test_own_cpu_counts_the_processes_it_started_while_they_run_and_after_they_end():
    """A grandchild (as the sandbox's interpreter under its launcher) burns 0.4 s of CPU and waits: its time
    counts as this process's while it lives, and still after it ends and is reaped (no drop, no double count)."""
    import subprocess
    import sys

    burn = (
        "import sys, time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.4: pass\n"
        "sys.stdout.write('done'); sys.stdout.flush()\n"
        "sys.stdin.read()\n"
    )
    before = threads._self_cpu_s()
    child = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout.read(4) == b"done"
        live = threads._self_cpu_s() - before
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    ended = threads._self_cpu_s() - before
    assert live >= 0.4
    assert ended >= live - 0.02 and ended < live + 0.5
