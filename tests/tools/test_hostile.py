"""The hostile suite: every program is judged contained from the host's side (see memrl.testing.hostile)."""

from __future__ import annotations

import os

import pytest

from memrl.testing.hostile import CASES, HostProbe, count_fds, live_children, run_case
from tests.tools.support import needs_bwrap

pytestmark = needs_bwrap


@pytest.fixture(scope="module")
def probe(sandbox):
    with HostProbe(sandbox.cfg.sandbox_uid) as p:
        yield p


def test_suite_covers_the_issue_list():
    assert len(CASES) >= 20
    assert len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hostile_program_is_contained(case, sandbox, probe):
    escapes = run_case(case, sandbox.run, probe)
    assert escapes == []
    assert os.getpid() > 0 and probe.sentinel.poll() is None  # the host side is alive


def test_probe_detects_a_real_escape(probe):
    """The checks can fail: code run WITHOUT the sandbox (plain exec here) is caught writing and reading."""
    import contextlib
    import io

    from memrl.tools.sandbox import SandboxResult

    buf = io.StringIO()
    code = probe.subst(
        "import os\nprint(os.environ['MEMRL_SANDBOX_CANARY'])\nopen($targets[0], 'w').write('x')"
    )
    with contextlib.redirect_stdout(buf):
        exec(code, {})
    found = probe.check(SandboxResult(0, buf.getvalue(), "", False, None))
    probe.write_targets[0].unlink()
    assert any("secret" in f for f in found) and any("host file written" in f for f in found)


def test_parallel_hostile_batch_leaves_nothing(sandbox, probe):
    fds, kids = count_fds(), live_children()
    picked = [
        c for c in CASES if c.name in ("fork_bomb", "setsid_double_fork", "endless_stdout", "kill_parent")
    ]
    results = sandbox.run_many([probe.subst(c.code) for c in picked])
    for r in results:
        assert probe.check(r) == []
    assert count_fds() == fds and live_children() == kids
