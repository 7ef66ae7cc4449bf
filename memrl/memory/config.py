from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MemoryConfig:
    """Long-term fact store, short-term compression and retrieval (owned by memrl.memory)."""

    embedder: str = "minilm"
    embedder_model: str | None = None
    device: str = "cpu"
    store: str = "faiss"
    index: str = "flat"
    extractor: str = "rule"
    compressor: str = "extractive"
    summary_token_budget: int = 256
    retrieval: str = "hybrid"
    top_k: int = 10
