"""Gold memory operations from turn metadata (the synthetic task knows every turn's)."""

from __future__ import annotations

from memrl.memory.extract import FactDecision
from memrl.memory.gold import gold_text, holds, ops_right
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


def test_holds_is_a_word_test():
    assert holds("Leo's home is in Rome now", "Leo", "Rome")
    assert not holds("Leonora lives in Rome", "Leo", "Rome")
