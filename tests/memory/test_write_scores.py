"""Scoring memory writes against the synthetic task's gold decisions (real MiniLM and FAISS; a scripted policy
writes)."""

from __future__ import annotations

from memrl.adapters.synthetic import make_episode
from memrl.memory.config import MemoryConfig
from memrl.memory.llm import policy_text_generator
from memrl.memory.manager import MemorySystem
from memrl.memory.write_scores import expected_decisions, score_writes
from memrl.testing.models import byte_tokenizer
from memrl.testing.scripted import ScriptedPolicy

EPISODES = [make_episode(0, "train", i, phrasing="varied") for i in range(2)]


def _system(minilm, reply: str, calls: list) -> MemorySystem:
    policy = ScriptedPolicy(byte_tokenizer(), lambda ctx: calls.append(ctx) or reply)
    return MemorySystem(
        MemoryConfig(extractor="policy"), embedder=minilm, generate_text=policy_text_generator(policy)
    )


def test_a_writer_that_always_skips_recalls_only_noop_and_leaves_no_namespace(minilm):
    calls: list = []
    system = _system(minilm, "NOOP", calls)
    scores = score_writes(system, EPISODES, chunk=1)
    truths = [t.op.value for ep in EPISODES for t in expected_decisions(ep.history)]
    assert scores["turns"] == len(truths) == len(calls) == scores["writes"]
    assert scores["recall"]["NOOP"] == 1.0 and scores["recall"]["ADD"] == 0.0
    assert scores["expected"]["ADD"] == truths.count("ADD") and scores["malformed_replies"] == 0
    assert not system._managers  # every scored episode's namespace is released


def test_chunk_zero_writes_each_whole_history_at_once(minilm):
    calls: list = []
    system = _system(minilm, "NOOP", calls)
    scores = score_writes(system, EPISODES, chunk=0)
    assert scores["writes"] == len(EPISODES) == len(calls)
    assert scores["turns"] == sum(len(ep.history) for ep in EPISODES)


def test_gold_adds_without_attribute_or_value_score_by_the_person_named():
    # LoCoMo's observations (adapter option gold_memory: observations) name a person, no attribute or value.
    from memrl.memory.write_scores import holds
    from memrl.types import TurnRole, TurnSpec

    meta = {
        "memory_op": "ADD",
        "memory_fact": "Caroline went to a support group.",
        "memory_person": "Caroline",
    }
    turns = [TurnSpec(TurnRole.HISTORY, "I went to a support group.", "D1:3", speaker="Caroline", metadata=meta),
             TurnSpec(TurnRole.HISTORY, "Cool!", "D1:4", speaker="Mel", metadata={"memory_op": "NOOP"})]  # fmt: skip
    expected = expected_decisions(turns)
    assert [e.op.value for e in expected] == ["ADD", "NOOP"] and expected[0].person == "Caroline"
    assert holds("Caroline attended an LGBTQ support group.", "Caroline", "", "")
    assert not holds("Melanie paints.", "Caroline", "", "")
    assert not holds("Caroline lives in Rome.", "Caroline", "city", "Oslo")  # a value still has to be there
