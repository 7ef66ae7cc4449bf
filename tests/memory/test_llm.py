"""The PolicyClient → generate_text adapter, on the real tiny HF policy (random weights → garbage replies)."""

from __future__ import annotations

import logging

import pytest

from memrl.memory.config import MemoryConfig
from memrl.memory.llm import policy_text_generator
from memrl.memory.manager import MemorySystem
from memrl.types import MemoryOpType, TurnSpec


@pytest.fixture(scope="module")
def generate_text(tiny_hf_policy):
    return policy_text_generator(tiny_hf_policy, max_tokens=12)


def test_adapter_returns_one_text_per_prompt(generate_text):
    out = generate_text(["Summarise: Ann moved to Bergen.", "Hello"])
    assert len(out) == 2 and all(isinstance(t, str) for t in out)
    assert generate_text([]) == []


def test_llm_memory_with_a_real_untrained_policy_never_fails_silently(generate_text, minilm, caplog):
    """An untrained model cannot write JSON: every turn becomes a logged NOOP with the reason, and a
    failed summary keeps the previous one, also logged."""
    cfg = MemoryConfig(extractor="llm", compressor="llm", summary_token_budget=64)
    system = MemorySystem(cfg, embedder=minilm, generate_text=generate_text)
    mgr = system.manager("ep")
    turn = TurnSpec("history", "I moved to Bergen.", "D1:1", "Ann", "1 May 2023")
    with caplog.at_level(logging.WARNING):
        ops = mgr.extract_facts(turn)
        comp = mgr.compress_short_term([turn])
    assert [o.op for o in ops] == [MemoryOpType.NOOP]
    assert ops[0].text.startswith("malformed llm output") and "D1:1" in caplog.text
    assert mgr.facts() == []
    # 12 random bytes may or may not form a sentence; either way the op says what happened.
    if comp.op is MemoryOpType.COMPRESS:
        assert comp.summary_id is not None and mgr.summary == comp.text
    else:
        assert comp.op is MemoryOpType.NOOP and comp.text.startswith("compression failed")
