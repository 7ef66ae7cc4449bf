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
