"""Sandbox fixtures: small limits (memrl.tools.hostile.quick_limits) so the hostile suite stays fast."""

from __future__ import annotations

import shutil

import pytest

from memrl.tools import Sandbox, SandboxConfig
from memrl.tools.hostile import quick_limits

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def small_config(**overrides) -> SandboxConfig:
    return quick_limits(**overrides)


@pytest.fixture(scope="module")
def sandbox():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    with Sandbox(small_config()) as sb:
        yield sb
