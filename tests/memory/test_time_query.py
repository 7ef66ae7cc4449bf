"""Time expressions in questions (memrl.memory.time_query): named periods, relative dates, the rescoring."""

from __future__ import annotations

import datetime as dt

import pytest

from memrl.memory.config import MemoryConfig
from memrl.memory.manager import MemorySystem
from memrl.memory.store import FactRecord
from memrl.memory.time_query import parse_date, query_periods, relative_period, time_rescore
from memrl.types import TurnSpec


def test_time_rescore_boosts_the_named_period():
    recs = {
        1: FactRecord(1, "ep", "a", timestamp="8 May 2023", order=0),
        2: FactRecord(2, "ep", "b", timestamp="20 June 2024", order=1),
    }
    assert query_periods("What happened in June 2024?") == ({"2024"}, {"june"})
    ranked = [(1, 0.42), (2, 0.4)]
    assert time_rescore(ranked, recs, "What happened in June 2024?")[0][0] == 2
    assert time_rescore(ranked, recs, "What did Ann adopt?")[0][0] == 1


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
