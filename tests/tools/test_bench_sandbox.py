"""Smoke test of ``memrl bench sandbox`` (lives here because the tools layer owns that bench)."""

from __future__ import annotations

from memrl.bench import BENCHES
from tests.tools.support import needs_bwrap

KEYS = {
    "cases",
    "escapes",
    "overhead_ratio",
    "kill_latency_s",
    "leaked_processes",
    "leaked_fds",
    "calls_per_s",
}


@needs_bwrap
def test_bench_reports_the_issue_keys_and_no_leaks():
    out = BENCHES.get("sandbox")(["--runs", "12", "--overhead-samples", "3", "--skip-hostile"])
    assert set(out) >= KEYS
    assert out["runs"] == 12 and out["timeouts"] == 1 and out["wrong_results"] == 0
    assert out["leaked_processes"] == 0 and out["leaked_fds"] == 0
    assert out["overhead_ratio"] > 0 and out["calls_per_s"] > 0 and out["kill_latency_s"] >= 0
