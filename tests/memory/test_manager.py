"""MemorySystem / MemoryManager: batching, isolation, the op log, update_memory, persistence."""

from __future__ import annotations

import pytest

from memrl.memory.config import MemoryConfig
from memrl.memory.manager import MemorySystem
from memrl.memory.store import FaissFactStore
from memrl.types import MemoryOpType, TurnSpec


def turns(prefix, texts, speaker="Ann"):
    return [TurnSpec("history", t, f"{prefix}:{i}", speaker, "1 May 2023") for i, t in enumerate(texts)]


def test_batched_extraction_makes_one_encode_call_for_all_episodes(counting):
    system = MemorySystem(MemoryConfig(neighbour_turns=0), embedder=counting)
    a, b = system.manager("a"), system.manager("b")
    items = [(a, t) for t in turns("A", ["I play the cello.", "My cat is called Tom."])]
    items += [(b, t) for t in turns("B", ["I live in Lima.", "", "I love mangoes."], "Bob")]
    ops = system.extract_facts_batch(items)
    assert counting.calls == [4]  # 4 non-empty turns, one call
    assert [o.op for o in ops[3]] == [MemoryOpType.NOOP]
    assert [f.text for f in a.facts()] == ["Ann: I play the cello.", "Ann: My cat is called Tom."]
    assert [f.source_ids for f in b.facts()] == [("B:0",), ("B:2",)]
    assert system.embedding_texts([t for _, t in items]) == [
        "I play the cello.",
        "My cat is called Tom.",
        "I live in Lima.",
        "I love mangoes.",
    ]
    counting.calls.clear()
    hits = system.retrieve_batch([(a, "What pet does Ann have?"), (b, "Where does Bob live?")], k=1)
    assert counting.calls == [2]
    assert hits[0][0].text == "Ann: My cat is called Tom." and hits[1][0].text == "Bob: I live in Lima."


def test_episodes_never_see_each_others_facts(minilm):
    system = MemorySystem(MemoryConfig(neighbour_turns=0), embedder=minilm)
    a, b = system.manager("a"), system.manager("b")
    system.extract_facts_batch([(a, turns("A", ["The vault code is 4711."])[0])])
    assert b.retrieve("vault code", k=5) == []
    assert a.retrieve("vault code", k=5)[0].text == "Ann: The vault code is 4711."
    assert system.manager("a") is a
    system.release("a")
    assert system.manager("a").facts() == []


def test_compress_logs_summary_ids_and_update_memory_stores_answers(minilm):
    system = MemorySystem(MemoryConfig(summary_token_budget=32), embedder=minilm)
    mgr = system.manager("ep")
    hist = turns("D1", ["Hi!", "I moved to Bergen on 3 June 2023 for a hospital job."])
    op1 = mgr.compress_short_term(hist)
    op2 = mgr.compress_short_term(hist[1:])
    assert op1.op is MemoryOpType.COMPRESS and op2.summary_id == op1.summary_id + 1
    assert "Bergen" in mgr.summary and op2.source_ids == ("D1:1",)
    with pytest.raises(ValueError, match="at least one turn"):
        mgr.compress_short_term([])

    mark = len(mgr.memory_ops)
    ops = mgr.update_memory("<search>bergen</search><result>...</result><answer>Bergen</answer>", "Q")
    assert ops[0].op is MemoryOpType.ADD and ops[0].text == "assistant: Bergen" and ops[0].turn_id == "Q"
    empty = mgr.update_memory("<answer> </answer>", "Q2")
    assert empty[0].op is MemoryOpType.NOOP and "no answer" in empty[0].text
    assert mgr.ops_since(mark) == ops + empty


def test_system_save_and_reload_keeps_facts(minilm, tmp_path):
    system = MemorySystem(MemoryConfig(), embedder=minilm)
    mgr = system.manager("ep")
    mgr.extract_facts(turns("D1", ["I collect vintage stamps."])[0])
    system.save(str(tmp_path / "mem.bin"))
    store = FaissFactStore.load(str(tmp_path / "mem.bin"), MemoryConfig())
    again = MemorySystem(MemoryConfig(neighbour_turns=0), embedder=minilm, store=store)
    assert again.manager("ep").retrieve("hobby stamps", k=1)[0].text == "Ann: I collect vintage stamps."


def test_config_validation_has_fix_it_messages():
    with pytest.raises(ValueError, match="expected one of"):
        MemoryConfig(index="annoy")
