"""Dense / BM25 / hybrid retrieval, time-aware scoring and neighbour expansion on real MiniLM + FAISS."""

from __future__ import annotations

import datetime as dt

import pytest

from memrl.memory.config import MemoryConfig
from memrl.memory.manager import MemorySystem
from memrl.memory.retrieval import (
    RETRIEVERS,
    asks_about_past,
    attach_history,
    parse_date,
    query_periods,
    relative_period,
    rrf,
    supersede_rescore,
    time_rescore,
    tokenize_stemmed,
)
from memrl.memory.store import FactRecord
from memrl.types import MemoryOpType, TurnSpec

HISTORY = [
    ("D1:1", "Ann", "8 May 2023", "I adopted a puppy yesterday, he is so fluffy."),
    ("D1:2", "Bob", "8 May 2023", "Congrats! What did you name him?"),
    ("D1:3", "Ann", "8 May 2023", "His name is Zorblax, after a cartoon."),
    ("D2:1", "Bob", "20 June 2024", "I started a new job as a carpenter."),
    ("D2:2", "Ann", "20 June 2024", "I'm training for the Bergen marathon."),
    ("D2:3", "Bob", "20 June 2024", "Currently I am reading a novel about pirates."),
]


@pytest.fixture(scope="module")
def system(minilm):
    """One system per retrieval mode over the same history (one encode call each)."""
    systems = {}
    for mode in ("dense", "bm25", "hybrid"):
        s = MemorySystem(
            MemoryConfig(retrieval=mode, candidate_pool=10, top_k=3, neighbour_turns=0), embedder=minilm
        )
        s.extract_facts_batch(
            [(s.manager("ep"), TurnSpec("history", x, i, sp, ts)) for i, sp, ts, x in HISTORY]
        )
        systems[mode] = s
    return systems


def test_tokenize_drops_stopwords_and_stems():
    assert tokenize_stemmed("What did the dogs eat in 2023?") == ["dog", "eat", "2023"]
    assert tokenize_stemmed("Painting the paintings") == ["paint", "paint"]


def test_rrf_fuses_by_rank():
    fused = rrf([([(1, 9.0), (2, 8.0)], 1.0), ([(2, 0.5), (3, 0.1)], 1.0)], rrf_k=60, k=3)
    assert [f for f, _ in fused] == [2, 1, 3]
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 61)


def test_bm25_finds_rare_token_dense_finds_paraphrase(system):
    bm25 = system["bm25"].manager("ep").retrieve("Zorblax", k=1)
    assert bm25[0].source_ids == ("D1:3",)
    dense = system["dense"].manager("ep").retrieve("Which pet did Ann get?", k=1)
    assert dense[0].source_ids == ("D1:1",)
    # hybrid gets both right
    assert system["hybrid"].manager("ep").retrieve("Zorblax", k=1)[0].source_ids == ("D1:3",)
    assert system["hybrid"].manager("ep").retrieve("Which pet did Ann get?", k=1)[0].source_ids == ("D1:1",)


def test_scores_descend_and_retrieve_is_logged(system):
    mgr = system["hybrid"].manager("ep")
    hits = mgr.retrieve("What job did Bob start?", k=3, turn_id="Q")
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
    assert (
        hits[0].source_ids == ("D2:1",) and hits[0].timestamp == "20 June 2024" and hits[0].speaker == "Bob"
    )
    op = mgr.memory_ops[-1]
    assert (
        op.op is MemoryOpType.RETRIEVE and op.turn_id == "Q" and op.fact_ids == tuple(h.fact_id for h in hits)
    )
    assert op.text == "What job did Bob start?" and op.scores == tuple(h.score for h in hits)


def test_neighbour_expansion_attaches_adjacent_turns(minilm):
    s = MemorySystem(MemoryConfig(retrieval="bm25", neighbour_turns=1, top_k=2), embedder=minilm)
    s.extract_facts_batch([(s.manager("ep"), TurnSpec("history", x, i, sp, ts)) for i, sp, ts, x in HISTORY])
    hits = s.manager("ep").retrieve("Zorblax cartoon", k=1)
    assert hits[0].source_ids == ("D1:2", "D1:3", "D2:1")
    assert hits[0].text.split(" | ") == [
        "Bob: Congrats! What did you name him?",
        "Ann: His name is Zorblax, after a cartoon.",
        "Bob: I started a new job as a carpenter.",
    ]
    # Overlapping windows never repeat a fact: the second hit carries only what the first did not.
    two = s.manager("ep").retrieve("Zorblax name him", k=2)
    ids = [sid for h in two for sid in h.source_ids]
    assert len(ids) == len(set(ids))


def test_time_rescore_boosts_the_named_period():
    recs = {
        1: FactRecord(1, "ep", "a", timestamp="8 May 2023", order=0),
        2: FactRecord(2, "ep", "b", timestamp="20 June 2024", order=1),
    }
    assert query_periods("What happened in June 2024?") == ({"2024"}, {"june"})
    cfg = MemoryConfig(time_weight=1.0)
    assert time_rescore([(1, 0.5), (2, 0.4)], recs, "What happened in June 2024?", cfg)[0][0] == 2
    assert time_rescore([(1, 0.5), (2, 0.4)], recs, "What did Ann adopt?", cfg)[0][0] == 1
    off = MemoryConfig(time_weight=0)
    assert time_rescore([(1, 0.5), (2, 0.4)], recs, "in June 2024", off)[0][0] == 1


def test_unknown_retriever_lists_choices():
    with pytest.raises(KeyError, match="bm25, dense, hybrid"):
        RETRIEVERS.get("sparse")


def test_relative_period_reads_the_question_date():
    asked = "2023/05/29 (Mon) 10:00"
    assert parse_date(asked) == dt.date(2023, 5, 29)
    assert parse_date("1:56 pm on 8 May, 2023") == dt.date(2023, 5, 8)
    assert parse_date("sometime last spring") is None
    # "N units ago": the span's quarter (at least two days) on either side of that day.
    assert relative_period("What did I buy two weeks ago?", asked) == (
        dt.date(2023, 5, 12),
        dt.date(2023, 5, 18),
    )
    assert relative_period("Where was I 3 days ago?", asked) == (dt.date(2023, 5, 24), dt.date(2023, 5, 28))
    # "past / last N units": everything since then.
    assert relative_period("How many plants did I buy in the last month?", asked) == (
        dt.date(2023, 4, 29),
        dt.date(2023, 5, 29),
    )
    assert relative_period("Which trips did I take in the past three months?", asked)[0] == dt.date(
        2023, 2, 28
    )
    assert relative_period("What did I buy two weeks ago?", None) is None
    assert relative_period("When did I last see the dentist?", asked) is None


def test_a_dated_question_retrieves_the_session_in_its_range_over_a_better_worded_distractor(minilm):
    s = MemorySystem(MemoryConfig(neighbour_turns=0, top_k=1), embedder=minilm)
    turns = [
        ("old:0", "2023/03/01 (Wed) 09:00", "I joined a charity event, a 5K run for the food bank."),
        ("new:0", "2023/05/15 (Mon) 18:30", "Did a charity walk for the animal shelter this morning."),
    ]
    s.extract_facts_batch([(s.manager("ep"), TurnSpec("history", x, i, "user", ts)) for i, ts, x in turns])
    question = "What charity event did I join two weeks ago?"
    undated = s.retrieve_batch([(s.manager("ep"), question)])[0]
    assert undated[0].source_ids == ("old:0",)
    dated = s.retrieve_batch([(s.manager("ep"), question)], asked_at=["2023/05/29 (Mon) 10:00"])[0]
    assert dated[0].source_ids == ("new:0",)
    with pytest.raises(ValueError, match="asked_at"):
        s.retrieve_batch([(s.manager("ep"), question)], asked_at=[])


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


def _chain_records() -> dict[int, FactRecord]:
    # 0 → 1 → 2: Ann lived in Oslo, then Paris, now Rome; 3 (Bob's city) was superseded by 4.
    def rec(fid, text, by=None):
        extra = {} if by is None else {"superseded_by": by, "valid_until": "2023-05-01"}
        return FactRecord(fid, "ep", text, extra=extra)

    return {
        0: rec(0, "Ann lives in Oslo.", 1),
        1: rec(1, "Ann lives in Paris.", 2),
        2: rec(2, "Ann lives in Rome."),
        3: rec(3, "Bob lives in Lima.", 4),
        4: rec(4, "Bob lives in Cairo."),
    }


def test_a_stale_fact_is_dropped_when_its_current_successor_is_a_candidate():
    records = _chain_records()
    ranked = [(0, 0.9), (2, 0.8), (3, 0.7), (1, 0.6)]
    out = supersede_rescore(ranked, records, "Where does Ann live?", 0.5)
    # Oslo and Paris lead (by a chain) to Rome, a candidate: gone. Bob's Cairo is not a candidate: Lima stays,
    # ranked at half its score.
    assert out == [(2, 0.8), (3, 0.35)]
    # A question about the past keeps every value, as ranked.
    assert supersede_rescore(ranked, records, "Where did Ann live before?", 0.5) == ranked


def test_attached_history_gives_now_the_current_value_and_before_the_earlier_ones():
    records = _chain_records()
    ranked = [(0, 0.9), (3, 0.7), (1, 0.6)]  # Ann's stale Oslo ranks best; Rome itself is not a candidate
    now, shown = attach_history(ranked, records, "Where does Ann live now?")
    assert now == [(2, 0.9), (4, 0.7)]  # each chain is its current fact, at the chain's best score
    assert shown[2].text == "Ann lives in Rome." and not {0, 1, 3} & set(shown)  # stale facts are not shown
    before, shown = attach_history(ranked, records, "Where did Ann live before moving?")
    assert before == now
    assert shown[2].text == (
        "Earlier (until 2023-05-01): Ann lives in Oslo. Earlier (until 2023-05-01): Ann lives in Paris. "
        "Now: Ann lives in Rome."
    )
    # superseded_in_prompt: earlier: the past question sees the earlier values alone; a question about now is
    # answered as under attached.
    _, shown = attach_history(ranked, records, "Where did Ann live before moving?", earlier_only=True)
    assert shown[2].text == (
        "Earlier (until 2023-05-01): Ann lives in Oslo. Earlier (until 2023-05-01): Ann lives in Paris."
    )
    assert attach_history(ranked, records, "Where does Ann live now?", earlier_only=True)[1][2].text == (
        "Ann lives in Rome."
    )
    # A superseded fact whose successor is gone stands for itself, marked as no longer true.
    del records[4]
    alone, shown = attach_history([(3, 0.5)], records, "Where does Bob live?")
    assert alone == [(3, 0.5)] and "no longer true" in shown[3].text and 0 not in shown


def test_asks_about_past_reads_past_phrases_not_age_or_order():
    assert asks_about_past("Which city did Priya live in before moving?")
    assert asks_about_past("What job did Ann have previously?")
    assert asks_about_past("Where did Bo use to live?") and asks_about_past("What did Bo used to play?")
    assert not asks_about_past("How old is Ann?") and not asks_about_past("Which city does Ann live in now?")


def test_a_before_question_reaches_the_superseded_value_through_a_written_memory(minilm):
    """Real chats, the gold writer (UPDATEs supersede), MiniLM + FAISS: with superseded facts attached, a "before"
    question's hits hold the old value first and marked earlier, and a "now" question's hold no stale value."""
    from memrl.data.adapters import run_adapter

    episodes, _ = run_adapter("chats", None, split="test", options={"num_chats": 1})
    history = episodes[0].history
    asks = {
        ep.metadata["question_type"]: ep for ep in episodes if ep.metadata["question_type"] != "never_changed"
    }
    now, before = asks["now"], asks["before"]
    cfg = MemoryConfig(
        extractor="gold", top_k=3, superseded_in_prompt="attached"
    )  # passages of adjacent facts
    s = MemorySystem(cfg, embedder=minilm)
    mgr = s.manager("chat")
    for turn in history:
        s.extract_facts_batch([(mgr, turn)])
    (hits_now,), (hits_before,) = (s.retrieve_batch([(mgr, q.final_query)]) for q in (now, before))
    new, old = now.target_answer, before.target_answer
    assert any(new in h.text for h in hits_now) and not any(old in h.text for h in hits_now)
    # A passage joins adjacent facts with " | ": the one that names the old value.
    (line,) = [part for h in hits_before for part in h.text.split(" | ") if old in part]
    assert line.startswith("Earlier (until ") and line.index(old) < line.index("Now: ") < line.index(new)
