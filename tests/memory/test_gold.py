"""Gold memory operations from turn metadata (the synthetic task knows every turn's)."""

from __future__ import annotations

import pytest

from memrl.memory.extract import FactDecision
from memrl.memory.gold import gold_text, holds, ops_right, ops_score
from memrl.memory.store import FactRecord
from memrl.types import MemoryOpType, TurnRole, TurnSpec


def turn(text, op, tid="D1:1", **meta):
    return TurnSpec(TurnRole.HISTORY, text, tid, speaker="Leo", metadata={"memory_op": op, **meta})


MOVE = turn(
    "I moved from Paris to Rome.", "UPDATE", memory_fact="Leo lives in Rome.", memory_person="Leo",
    memory_value="Rome", memory_stale="Paris",
)  # fmt: skip
CHAT = turn("Nice weather today.", "NOOP")
SHOWN = (FactRecord(7, "ep", "Ann is a baker."), FactRecord(9, "ep", "Leo lives in Paris."))


def test_gold_text_targets_the_shown_stale_fact_by_its_local_id():
    assert gold_text([MOVE, CHAT], SHOWN) == "UPDATE 1 Leo lives in Rome.\nNOOP"
    # The stale fact was not shown: the right write is an ADD of the new value.
    assert gold_text([MOVE], SHOWN[:1]) == "ADD Leo lives in Rome."
    assert gold_text([TurnSpec(TurnRole.HISTORY, "hi", "x")], SHOWN) is None  # unknown: no gold


def test_ops_right_checks_op_target_and_value():
    upd = FactDecision(MemoryOpType.UPDATE, "Leo now lives in Rome.", fact_id=9, supersede=True)
    assert ops_right([MOVE, CHAT], SHOWN, [upd, FactDecision(MemoryOpType.NOOP)]) is True
    wrong_target = FactDecision(MemoryOpType.UPDATE, "Leo lives in Rome.", fact_id=7)
    assert ops_right([MOVE], SHOWN, [wrong_target]) is False
    assert ops_right([MOVE], SHOWN, [FactDecision(MemoryOpType.ADD, "Leo lives in Rome.")]) is False
    assert ops_right([CHAT], SHOWN, [FactDecision(MemoryOpType.ADD, "Nice weather.")]) is False
    assert ops_right([TurnSpec(TurnRole.HISTORY, "hi", "x")], SHOWN, []) is None


ANN = turn(
    "I am a baker now.",
    "ADD",
    "D1:2",
    memory_fact="Ann is a baker.",
    memory_person="Ann",
    memory_value="baker",
)
MIA = turn("Mia lives in Oslo.", "ADD", "D1:3", memory_fact="Mia lives in Oslo.", memory_person="Mia",
           memory_value="Oslo")  # fmt: skip


def test_ops_score_gives_partial_credit_line_by_line():
    add = lambda text: FactDecision(MemoryOpType.ADD, text)  # noqa: E731
    upd = FactDecision(MemoryOpType.UPDATE, "Leo now lives in Rome.", fact_id=9, supersede=True)
    turns = [MOVE, ANN, MIA, CHAT]
    right = [upd, add("Ann is a baker."), add("Mia lives in Oslo."), FactDecision(MemoryOpType.NOOP)]
    assert ops_score(turns, SHOWN, right) == 1.0 and ops_right(turns, SHOWN, right) is True
    # two of three gold writes, nothing extra: precision 1, recall 2/3
    assert ops_score(turns, SHOWN, right[:2]) == 0.8
    # a borrowed value (Mia in Paris) matches nothing, and a written chit-chat line is one extra write
    borrowed = [upd, add("Ann is a baker."), add("Mia lives in Paris."), add("Nice weather.")]
    assert ops_score(turns, SHOWN, borrowed) == 2 * 0.5 * (2 / 3) / (0.5 + 2 / 3)
    assert ops_right(turns, SHOWN, borrowed) is False
    assert ops_score(turns, SHOWN, []) == 0.0
    assert ops_score([CHAT], SHOWN, []) == 1.0  # nothing to write, nothing written
    assert ops_score([CHAT], SHOWN, [add("Nice weather.")]) == 0.0
    assert ops_score([TurnSpec(TurnRole.HISTORY, "hi", "x")], SHOWN, []) is None


def test_an_update_on_an_add_turn_is_wrong_unless_it_restates_the_fact():
    # Superseding Ann's other fact (she is a baker) to write where Mia lives loses a true fact.
    replaces = FactDecision(MemoryOpType.UPDATE, "Mia lives in Oslo.", fact_id=7, supersede=True)
    assert ops_score([MIA], SHOWN, [replaces]) == 0.0 and ops_right([MIA], SHOWN, [replaces]) is False
    restates = FactDecision(MemoryOpType.UPDATE, "Ann is a baker now.", fact_id=7, supersede=True)
    assert ops_score([ANN], SHOWN, [restates]) == 1.0


def test_holds_is_a_word_test():
    assert holds("Leo's home is in Rome now", "Leo", "Rome")
    assert not holds("Leonora lives in Rome", "Leo", "Rome")


def test_the_gold_extractor_supersedes_the_stale_fact_and_keeps_it_as_history(minilm):
    from memrl.memory.config import MemoryConfig
    from memrl.memory.manager import MemorySystem

    system = MemorySystem(MemoryConfig(extractor="gold", write_neighbours=4), embedder=minilm)
    mgr = system.manager("ep")
    first = turn("I live in Paris.", "ADD", "D1:1", memory_fact="Leo lives in Paris.", memory_person="Leo",
                 memory_value="Paris")  # fmt: skip
    for t in (first, ANN, CHAT, MOVE):
        mgr.extract_facts(t)
    facts = {f.text: f for f in system.store.records("ep")}
    assert set(facts) == {"Leo lives in Paris.", "Ann is a baker.", "Leo lives in Rome."}
    assert facts["Leo lives in Paris."].superseded and not facts["Leo lives in Rome."].superseded
    assert [op.op for op in mgr.memory_ops] == [
        MemoryOpType.ADD, MemoryOpType.ADD, MemoryOpType.NOOP, MemoryOpType.UPDATE,
    ]  # fmt: skip


def test_the_gold_extractor_refuses_a_turn_without_gold_operations(minilm):
    from memrl.memory.config import MemoryConfig
    from memrl.memory.manager import MemorySystem

    system = MemorySystem(MemoryConfig(extractor="gold"), embedder=minilm)
    with pytest.raises(ValueError, match=r"extractor=gold: history turn D9:9 has no gold operation"):
        system.manager("ep").extract_facts(TurnSpec(TurnRole.HISTORY, "hello", "D9:9"))


def test_the_gold_extractor_remembers_nothing_of_the_agent_s_own_answer(minilm):
    from memrl.memory.config import MemoryConfig
    from memrl.memory.manager import MemorySystem

    system = MemorySystem(MemoryConfig(extractor="gold"), embedder=minilm)
    ops = system.manager("ep").update_memory("<answer>Rome</answer>", "Q")
    assert [op.op for op in ops] == [MemoryOpType.NOOP] and system.store.records("ep") == []


def test_keep_turns_adds_the_verbatim_turn_beside_the_gold_write(minilm):
    from memrl.memory.config import MemoryConfig
    from memrl.memory.manager import MemorySystem

    for keep, want in ((False, ["Ann is a baker."]), (True, ["Leo: I am a baker now.", "Ann is a baker."])):
        system = MemorySystem(MemoryConfig(extractor="gold", keep_turns=keep), embedder=minilm)
        mgr = system.manager("ep")
        system.extract_facts_batch([(mgr, ANN), (mgr, CHAT)])
        chat = ["Leo: Nice weather today."] if keep else []
        assert [r.text for r in mgr.facts()] == want + chat
