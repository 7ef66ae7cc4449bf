"""Where memrl keeps files it downloads or builds once: ``$MEMRL_CACHE_DIR`` (default ``~/.cache/memrl``), and
where it looks for dataset files a user already has: ``$MEMRL_DATA_DIR``.

    cache_dir() / "models"       converted embedded policy (memrl.policy.models)
    cache_dir() / "embeddings"   text → vector cache (memrl.memory.embed_cache)
    cache_dir() / "evals"        reusable baseline evaluations (memrl.train.loop)
    cache_dir() / "datasets"     files downloaded by ``memrl data fetch`` (memrl.data.sources)
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$MEMRL_CACHE_DIR`` or ``~/.cache/memrl``."""
    return Path(os.environ.get("MEMRL_CACHE_DIR") or Path.home() / ".cache" / "memrl")


def data_dir() -> Path | None:
    """``$MEMRL_DATA_DIR`` (a folder of dataset files, flat or one subfolder per dataset), or None if unset."""
    value = os.environ.get("MEMRL_DATA_DIR")
    return Path(value).expanduser() if value else None
