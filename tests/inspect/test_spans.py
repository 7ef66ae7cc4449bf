from __future__ import annotations

import pytest

from memrl.inspect.spans import decode_spans, span_bounds
from memrl.testing import byte_tokenizer


def test_bounds_cut_at_mask_changes_and_cuts():
    assert span_bounds([1, 1, 0, 0, 1], cuts=[1]) == [(0, 1), (1, 2), (2, 4), (4, 5)]
    assert span_bounds([1, 1, 1], cuts=[0, 3, 7]) == [(0, 3)]  # out-of-range cuts ignored
    assert span_bounds([]) == []


def test_decode_spans_round_trips_text_and_flags_tool_tokens():
    tok = byte_tokenizer()
    model = tok("<python>print(1)</python>", add_special_tokens=False)["input_ids"]
    tool = tok(" <result>1</result>", add_special_tokens=False)["input_ids"]
    answer = tok("<answer>1</answer>", add_special_tokens=False)["input_ids"]
    ids = model + tool + answer
    mask = [1] * len(model) + [0] * len(tool) + [1] * len(answer)
    spans = decode_spans(tok, ids, mask, cuts=[5])
    assert "".join(s[3] for s in spans) == tok.decode(ids)
    assert [s[2] for s in spans] == [1, 1, 0, 1]
    assert spans[2][3] == " <result>1</result>"


def test_decode_spans_rejects_misaligned_mask():
    with pytest.raises(ValueError, match="3 ids but 2 mask"):
        decode_spans(byte_tokenizer(), [3, 4, 5], [1, 1])
