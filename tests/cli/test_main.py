"""The command line's logging: memrl's INFO lines, third-party INFO (faiss's loader, httpx) only with -v."""

from __future__ import annotations

import logging

import pytest

from memrl.cli.main import QUIET_LOGGERS, configure_logging


@pytest.fixture
def restore_levels():
    names = [*QUIET_LOGGERS, "faiss.loader"]
    before = {n: logging.getLogger(n).level for n in names}
    yield
    for n, level in before.items():
        logging.getLogger(n).setLevel(level)


def test_third_party_info_is_quiet_unless_verbose(restore_levels):
    configure_logging(verbose=False)
    assert not logging.getLogger("faiss.loader").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert logging.getLogger("faiss.loader").isEnabledFor(logging.WARNING)
    assert not any(n.startswith("memrl") for n in QUIET_LOGGERS)
    configure_logging(verbose=True)
    assert logging.getLogger("faiss.loader").getEffectiveLevel() == logging.getLogger().level
