"""Decoded response spans: what an inspector shows without a tokenizer.

A leaf's response is cut at every change of ``response_mask`` (model tokens vs tool results / feedback) and at
extra positions (tree node boundaries), and each span is decoded once. The episode assembler stores the spans in
``StepMeta.extra["response_spans"]`` as ``[start, end, is_model, text]`` so a run directory can be read with no
model files at hand. One decode call per span keeps this cheap next to generation (a leaf has a handful).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def span_bounds(mask: Sequence[int], cuts: Iterable[int] = ()) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` covering ``range(len(mask))``: new span at each mask change and at each cut.

    >>> span_bounds([1, 1, 0, 0, 1], cuts=[1])
    [(0, 1), (1, 2), (2, 4), (4, 5)]
    """
    n = len(mask)
    marks = {0, n} | {int(c) for c in cuts if 0 < int(c) < n}
    marks |= {i for i in range(1, n) if mask[i] != mask[i - 1]}
    points = sorted(marks)
    return [(a, b) for a, b in zip(points, points[1:], strict=False) if b > a]


def decode_spans(
    tokenizer: Any, ids: Sequence[int], mask: Sequence[int], cuts: Iterable[int] = ()
) -> list[list[Any]]:
    """``[[start, end, is_model, text], ...]`` for the response ``ids``; ``is_model`` is 1 for policy tokens."""
    if len(ids) != len(mask):
        raise ValueError(f"decode_spans: {len(ids)} ids but {len(mask)} mask values")
    out = []
    for a, b in span_bounds(mask, cuts):
        text = tokenizer.decode(list(ids[a:b]), skip_special_tokens=True)
        out.append([a, b, int(mask[a]), text])
    return out
