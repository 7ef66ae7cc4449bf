"""Superseded facts in rankings and prompts (memrl.memory.superseded), alone and through a written memory."""

from __future__ import annotations

from memrl.memory.config import MemoryConfig
from memrl.memory.manager import MemorySystem
from memrl.memory.store import FactRecord
from memrl.memory.superseded import asks_about_past, attach_history, supersede_rescore


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
    out = supersede_rescore(ranked, records, "Where does Ann live?")
    # Oslo and Paris lead (by a chain) to Rome, a candidate: gone. Bob's Cairo is not a candidate: Lima stays,
    # ranked at half its score.
    assert out == [(2, 0.8), (3, 0.35)]
    # A question about the past keeps every value, as ranked.
    assert supersede_rescore(ranked, records, "Where did Ann live before?") == ranked


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
