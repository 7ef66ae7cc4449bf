"""The rescoring pipeline after retrieval (memrl.memory.rescore), through MemorySystem.retrieve_batch."""

from __future__ import annotations

import pytest

from memrl.memory.config import MemoryConfig
from memrl.memory.manager import MemorySystem
from memrl.memory.rescore import Question, rescore
from memrl.memory.store import FactRecord
from memrl.types import TurnSpec

ASSISTANT_CHAT = [
    ("user", "Can you give me some tips for first-time cat owners?"),
    (
        "assistant",
        "Sure! New cats need a quiet room, a litter box, scratching posts and a vet visit in the first weeks; "
        "cats adopted from a shelter often hide for a few days before they explore.",
    ),
    ("user", "Thanks! I adopted two cats from the shelter last week."),
    (
        "assistant",
        "Adopting cats from a shelter is wonderful! Give your adopted cats time, feed them at the same hours "
        "every day and let them come to you; most adopted cats settle in within a month.",
    ),
    ("user", "My landlord allows pets, luckily."),
    ("assistant", "That is great news; landlords often ask for a pet deposit, so check your lease."),
    ("user", "What should I cook for dinner tonight?"),
    ("assistant", "A quick pasta with tomatoes, garlic and basil takes twenty minutes."),
]


def test_a_question_about_oneself_spends_the_budget_on_what_the_asker_said(minilm):
    s = MemorySystem(MemoryConfig(top_k=1, neighbour_turns=1), embedder=minilm)
    turns = [TurnSpec("history", t, f"s1:{i}", sp) for i, (sp, t) in enumerate(ASSISTANT_CHAT)]
    s.extract_facts_batch([(s.manager("ep"), t) for t in turns])
    mgr = s.manager("ep")

    def sources(question: str, asked_by: str | None) -> list[str]:
        return [i for hit in mgr.retrieve(question, asked_by=asked_by) for i in hit.source_ids]

    # The assistant's topical reply is the best match; its window spends the budget on it.
    assert "s1:3" in sources("How many cats did I adopt?", None)
    # Asked by the user about themself, the user's own turns are worth twice as much: the budget goes to the
    # user's statement and other user turns, not to the long reply.
    mine = sources("How many cats did I adopt?", "user")
    assert mine[0] == "s1:2" and "s1:3" not in mine and "s1:1" not in mine
    # A question that does not speak in the first person gets no prior.
    impersonal = sources("How many cats were adopted?", None)
    assert "s1:3" in impersonal and sources("How many cats were adopted?", "user") == impersonal
    with pytest.raises(ValueError, match="asked_by"):
        s.retrieve_batch([(mgr, "How many cats did I adopt?")], asked_by=[])


def test_rescore_drops_a_stale_value_for_now_and_folds_it_in_for_before():
    stale = {"superseded_by": 1, "valid_until": "1 June 2024"}
    facts = [
        FactRecord(0, "ep", "Ann lives in Oslo.", timestamp="8 May 2023", order=0, extra=stale),
        FactRecord(1, "ep", "Ann lives in Rome.", timestamp="1 June 2024", order=1),
        FactRecord(2, "ep", "Bob likes tea.", timestamp="1 June 2024", order=2),
    ]
    ranked = [(0, 0.9), (2, 0.5), (1, 0.4)]

    def run(question: str, **cfg):
        cfg = MemoryConfig(neighbour_turns=0, **cfg)
        return rescore(ranked, facts, Question(question), cfg, k=2, tokens=lambda rec: 1)

    # separate: Oslo's successor is a candidate, so a question about now never sees Oslo.
    assert [it.lead.fact_id for it in run("Where does Ann live?")] == [2, 1]
    # attached: Rome stands for the chain at its best score; a past question reads Oslo first.
    (first, _) = run("Where did Ann live before?", superseded_in_prompt="attached")
    assert first.lead.fact_id == 1 and first.score == 0.9
    assert first.text == "Earlier (until 1 June 2024): Ann lives in Oslo. Now: Ann lives in Rome."
