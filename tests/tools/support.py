"""Shared helpers of the sandbox tests (importable, unlike conftest): small limits keep the hostile suite fast."""

from __future__ import annotations

import shutil

import pytest

from memrl.testing.hostile import quick_limits
from memrl.tools import SandboxConfig

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


def small_config(**overrides) -> SandboxConfig:
    return quick_limits(**overrides)
