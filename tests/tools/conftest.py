"""Sandbox fixtures (helpers live in tests/tools/support.py so test modules can import them)."""

from __future__ import annotations

import shutil

import pytest

from memrl.tools import Sandbox
from tests.tools.support import small_config


@pytest.fixture(scope="module")
def sandbox():
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    with Sandbox(small_config()) as sb:
        yield sb
