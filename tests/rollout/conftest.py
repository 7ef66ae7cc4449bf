"""Rollout fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tok():
    """transformers.ByT5Tokenizer: byte-level, needs no files (eos 1, pad 0)."""
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()
