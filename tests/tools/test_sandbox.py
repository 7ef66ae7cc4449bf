"""The sandbox itself: results, errors as text, kills, capping, the pool, modes and their refusals."""

from __future__ import annotations

import logging
import os

import pytest

from memrl.testing.hostile import count_fds, live_children, processes_in_pidns
from memrl.tools import Sandbox, SandboxConfig, ToolInfraError
from memrl.tools import launchers as launchers_mod
from tests.tools.support import needs_bwrap, small_config


@needs_bwrap
def test_runs_code_and_returns_output(sandbox):
    r = sandbox.run("import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)")
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.killed_reason) == (
        0,
        "42\n",
        "warn\n",
        False,
        None,
    )


@needs_bwrap
@pytest.mark.parametrize(
    ("code", "line"),
    [
        ("x y", "SyntaxError: invalid syntax"),
        ("print(x)", "NameError: name 'x' is not defined"),
        ("1 / 0", "ZeroDivisionError: division by zero"),
        ("import numpy_does_not_exist", "ModuleNotFoundError: No module named 'numpy_does_not_exist'"),
        ("def f():\n  return 1\n    x = 2", "IndentationError: unexpected indent"),
    ],
)
def test_exceptions_end_with_the_exception_line(sandbox, code, line):
    r = sandbox.run(code)
    assert r.exit_code == 1
    assert r.stderr.rstrip().splitlines()[-1] == line
    assert "_s.stdin" not in r.stderr and "<sandbox>" in r.stderr  # no bootstrap frames, the user's file name


@needs_bwrap
def test_timeout_kills_the_tree_and_keeps_earlier_output(sandbox):
    r = sandbox.run(
        "import os, time\nos.fork()\nprint('started', flush=True)\ntime.sleep(100)", timeout_s=0.5
    )
    assert r.timed_out and r.killed_reason == "timeout" and r.exit_code == -9
    assert "started" in r.stdout
    assert r.kill_latency_s is not None and r.kill_latency_s >= 0
    assert processes_in_pidns(r.extra["pid_namespace"]) == []


@needs_bwrap
def test_output_is_capped_while_reading(sandbox):
    r = sandbox.run("import sys\nsys.stdout.write('A' * 100 + 'x' * 50000 + 'Z' * 100)")
    assert r.stdout_bytes == 50200
    assert r.stdout.startswith("A" * 100) and r.stdout.endswith("Z" * 100)
    assert "bytes omitted" in r.stdout and len(r.stdout) < 8192 + 100


@needs_bwrap
def test_output_flood_is_killed(sandbox):
    r = sandbox.run("while True:\n    print('y' * 1000)")
    assert r.killed_reason == "output_limit" and r.stdout_bytes > sandbox.cfg.max_stream_bytes
    assert len(r.stdout) < sandbox.cfg.capture_bytes + 100


@needs_bwrap
def test_pool_runs_in_parallel_in_input_order_without_leaks(sandbox):
    fds, kids = count_fds(), live_children()
    codes = [f"print({i} * 2)" for i in range(8)] + ["1/0", "while True: pass"]
    results = sandbox.run_many(codes, timeout_s=1.0)
    assert [r.stdout for r in results[:8]] == [f"{i * 2}\n" for i in range(8)]
    assert results[8].exit_code == 1 and results[9].timed_out
    assert count_fds() == fds and live_children() == kids


@needs_bwrap
def test_exit_and_quit_exist_without_site(sandbox):
    r = sandbox.run("print('a')\nexit(3)\nprint('b')")
    assert (r.exit_code, r.stdout) == (3, "a\n")


@needs_bwrap
def test_stdin_is_closed_and_program_is_not_on_disk(sandbox):
    r = sandbox.run("import sys, os\nprint(sys.stdin.closed, os.listdir('/tmp'))")
    assert r.stdout == "True []\n"


def test_missing_bubblewrap_refuses_with_fix_it(monkeypatch):
    monkeypatch.setattr(launchers_mod, "BWRAP", "/nonexistent/bwrap")
    monkeypatch.setattr(launchers_mod.shutil, "which", lambda name: None)
    with pytest.raises(ToolInfraError, match="mode=rlimit"):
        Sandbox(SandboxConfig())


def test_broken_bubblewrap_is_an_infra_error_not_an_observation():
    cfg = small_config(ro_binds=["/proc/self/fd/../../nonexistent-dir-for-memrl"])
    with pytest.raises(ToolInfraError, match="does not exist"):
        Sandbox(cfg)


@needs_bwrap
def test_bwrap_setup_failure_raises(monkeypatch):
    sb = Sandbox(small_config())
    real = sb.launcher._fs_args
    monkeypatch.setattr(sb.launcher, "_fs_args", lambda: ["--ro-bind", "/no/such/dir", "/x", *real()])
    with pytest.raises(
        ToolInfraError, match="sandbox failed to start the interpreter.*Can.t find source path"
    ):
        sb.run("print(1)")
    sb.close()


def test_rlimit_mode_warns_what_is_lost_and_still_limits(caplog):
    with caplog.at_level(logging.WARNING), Sandbox(small_config(mode="rlimit")) as sb:
        r = sb.run("import os\nprint(sorted(os.environ))\nb = bytearray(2**40)")
    assert "WITHOUT isolation" in caplog.text and "network" in caplog.text
    assert "MemoryError" in r.stderr and r.exit_code == 1
    assert "MEMRL" not in r.stdout and "PATH" in r.stdout and os.environ.get("PATH") not in r.stdout


def test_rlimit_mode_timeout_kills_the_group():
    kids = live_children()
    with Sandbox(small_config(mode="rlimit")) as sb:
        r = sb.run("import os, time\nos.fork()\ntime.sleep(100)", timeout_s=0.5)
    assert r.timed_out and live_children() == kids


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="tools.sandbox.mode='docker' is unknown; valid: bwrap, rlimit"):
        SandboxConfig(mode="docker")
    with pytest.raises(ValueError, match="sandbox_uid must not be 0"):
        SandboxConfig(sandbox_uid=0)
    with pytest.raises(ValueError, match="tools.sandbox.timeout_s must be > 0"):
        SandboxConfig(timeout_s=0)


def test_closed_pool_refuses():
    sb = Sandbox(small_config(mode="rlimit"))
    sb.close()
    with pytest.raises(ToolInfraError, match="closed"):
        sb.run("print(1)")


@pytest.fixture
def shared_dir():
    """A world-readable directory (pytest's tmp_path is 0700 — the sandbox uid could not bind it)."""
    import shutil
    import tempfile

    d = tempfile.mkdtemp(prefix="memrl-bind-", dir="/var/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


@needs_bwrap
def test_extra_read_only_binds_and_python_path(shared_dir):
    lib = os.path.join(shared_dir, "lib")
    os.mkdir(lib, 0o755)
    with open(os.path.join(lib, "helper_mod.py"), "w") as f:
        f.write("VALUE = 41 + 1\n")
    os.chmod(os.path.join(lib, "helper_mod.py"), 0o644)
    with Sandbox(small_config(ro_binds=[lib], python_path=[lib])) as sb:
        r = sb.run(f"import helper_mod\nprint(helper_mod.VALUE)\nopen({os.path.join(lib, 'x')!r}, 'w')")
    assert r.stdout == "42\n" and "Read-only file system" in r.stderr
    assert os.listdir(lib) == ["helper_mod.py"]


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="only root drops to sandbox_uid")
def test_unreadable_bind_is_refused_when_root(tmp_path):
    secret = tmp_path / "private"
    secret.mkdir(mode=0o700)
    with pytest.raises(ToolInfraError, match="cannot read it"):
        Sandbox(small_config(ro_binds=[str(secret)]))


@needs_bwrap
def test_sandbox_processes_are_unprivileged_from_the_host_view(sandbox):
    import threading
    import time
    from pathlib import Path

    seen: list[dict[str, str]] = []

    def scan() -> None:
        time.sleep(0.4)
        for pid in live_children():
            fields = dict(
                line.split(":", 1)
                for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                if ":" in line
            )
            seen.append({k: fields[k].split()[0] for k in ("Name", "Uid", "CapEff", "NoNewPrivs")})

    t = threading.Thread(target=scan)
    t.start()
    sandbox.run("import time\ntime.sleep(1)")
    t.join()
    assert seen and all(s["Uid"] != "0" for s in seen)
    interpreter = [s for s in seen if s["Name"].startswith("python")]
    assert interpreter and all(
        s["CapEff"] == "0000000000000000" and s["NoNewPrivs"] == "1" for s in interpreter
    )
