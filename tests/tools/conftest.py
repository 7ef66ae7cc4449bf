"""Sandbox fixtures: small limits so the hostile suite stays fast (the bench uses the defaults)."""

from __future__ import annotations

import shutil

import pytest

from memrl.tools import Sandbox, SandboxConfig

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def small_config(**overrides) -> SandboxConfig:
    base = dict(
        timeout_s=1.5,
        cpu_s=2,
        memory_mb=128,
        max_processes=16,
        tmp_mb=32,
        max_stream_bytes=1 << 20,
        capture_bytes=8192,
        concurrency=2,
    )
    base.update(overrides)
    return SandboxConfig(**base)


@pytest.fixture(scope="module")
def sandbox():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    with Sandbox(small_config()) as sb:
        yield sb
