"""Rollout fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tok():
    """transformers.ByT5Tokenizer: byte-level, needs no files (eos 1, pad 0)."""
    from transformers import ByT5Tokenizer

    return ByT5Tokenizer()


@pytest.fixture(autouse=True)
def _tag_parser(monkeypatch):
    """Use the tools layer's real parser registry when it exists; an interim tag parser otherwise."""
    import memrl.tools

    if not hasattr(memrl.tools, "PARSERS"):
        from rollout_fixtures import interim_tag_parser

        monkeypatch.setattr("memrl.rollout.toolcalls._parser", lambda name: interim_tag_parser)
