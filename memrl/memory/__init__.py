"""Memory: long-term facts (embedder + FAISS fact store), short-term compression, retrieval, memory-op log.

Entry points: :class:`MemorySystem` (one per batch) and :class:`MemoryManager` (one per episode). Attributes are
imported lazily so that ``memrl.config`` (which imports ``memrl.memory.config``) does not pull in FAISS/torch.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "MemoryConfig": "memrl.memory.config",
    "MemoryManager": "memrl.memory.manager",
    "MemorySystem": "memrl.memory.manager",
    "RetrievedFact": "memrl.memory.manager",
    "FactRecord": "memrl.memory.store",
    "FactStore": "memrl.memory.store",
    "FactStoreError": "memrl.memory.store",
    "policy_text_generator": "memrl.memory.llm",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'memrl.memory' has no attribute {name!r}")
