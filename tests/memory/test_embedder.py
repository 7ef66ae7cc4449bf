from __future__ import annotations

import numpy as np
import pytest
import torch

from memrl.memory.config import MemoryConfig
from memrl.memory.embedder import (
    EMBEDDERS,
    EmbedderError,
    build_embedder,
    bundled_minilm_path,
    normalise,
    resolve_dtype,
)
from memrl.registry import RegistryError


def test_bundled_model_directory_is_found():
    path = bundled_minilm_path()
    assert path.endswith("model")


def test_minilm_vectors_are_normalised_and_semantic(minilm):
    texts = ["I adopted a puppy last week.", "We got a new dog.", "The stock market fell sharply."]
    vecs = minilm.encode(texts)
    assert vecs.shape == (3, 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    sims = vecs @ vecs.T
    assert sims[0, 1] > sims[0, 2] + 0.2  # puppy ~ dog, not stocks


def test_batched_encoding_equals_single(minilm):
    texts = ["Ann lives in Oslo.", "Bob plays chess on Sundays."]
    batched = minilm.encode(texts)
    single = np.concatenate([minilm.encode([t]) for t in texts])
    np.testing.assert_allclose(batched, single, atol=1e-5)


def test_empty_input_and_token_counts(minilm):
    assert minilm.encode([]).shape == (0, minilm.dim)
    short, long = minilm.count_tokens(["hello", "hello there my old friend"])
    assert 0 < short < long


def test_normalise_keeps_zero_rows_finite():
    out = normalise(np.array([[3.0, 4.0], [0.0, 0.0]]))
    np.testing.assert_allclose(out, [[0.6, 0.8], [0.0, 0.0]])


def test_unknown_embedder_lists_choices():
    with pytest.raises(RegistryError, match="minilm"):
        EMBEDDERS.get("nope")


def test_bad_model_path_is_a_clear_error(tmp_path):
    cfg = MemoryConfig(embedder="sentence-transformers", embedder_model=str(tmp_path / "missing-model"))
    with pytest.raises(EmbedderError, match="missing-model"):
        build_embedder(cfg, cache=False)
    with pytest.raises(EmbedderError, match="needs memory.embedder_model"):
        build_embedder(MemoryConfig(embedder="sentence-transformers"), cache=False)


def test_bfloat16_encoder_keeps_unit_vectors_and_neighbours():
    """Half-precision weights: float32 unit vectors close to the float32 encoder's, same nearest neighbours."""
    bf16 = build_embedder(MemoryConfig(embedder_dtype="bfloat16"))
    fp32 = build_embedder(MemoryConfig(embedder_dtype="float32"))
    assert fp32.dtype == "float32"
    assert bf16.dtype == "bfloat16" and next(bf16.model.parameters()).dtype == torch.bfloat16
    texts = [
        "I adopted a puppy last week.",
        "We got a new dog.",
        "The stock market fell sharply.",
        "Shares dropped on Monday.",
        "Ann moved to Lisbon in May.",
        "She relocated to Portugal in spring.",
    ]
    lo, hi = bf16.encode(texts), fp32.encode(texts)
    assert lo.dtype == np.float32 and lo.shape == hi.shape
    np.testing.assert_allclose(np.linalg.norm(lo, axis=1), 1.0, atol=1e-5)
    assert (lo * hi).sum(1).min() > 0.99
    assert not np.array_equal(lo, hi)  # the weights really are bfloat16
    nearest = lambda v: np.argsort(-(v @ v.T), axis=1)[:, 1]  # noqa: E731
    np.testing.assert_array_equal(nearest(lo), nearest(hi))
    np.testing.assert_array_equal(nearest(hi), [1, 0, 3, 2, 5, 4])


def test_embedder_dtype_is_validated_and_auto_resolves():
    with pytest.raises(ValueError, match="embedder_dtype='half'.*bfloat16"):
        MemoryConfig(embedder_dtype="half")
    assert resolve_dtype("float16", "cpu") == "float16"
    assert resolve_dtype("auto", "cuda:0") == "float16"
    assert resolve_dtype("auto", "mps") == "float32"
    assert resolve_dtype("auto", "cpu") in ("bfloat16", "float32")
