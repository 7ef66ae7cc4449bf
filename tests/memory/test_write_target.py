"""Where a written UPDATE lands (memrl.memory.write_target), with the real MiniLM and FAISS store."""

from __future__ import annotations

import re

import numpy as np
import pytest

from memrl.memory.config import MemoryConfig
from memrl.memory.extract import FactDecision
from memrl.memory.llm import policy_text_generator
from memrl.memory.manager import MemorySystem
from memrl.memory.store import FactRecord
from memrl.memory.write_target import resolve_updates, same_frame, similarity
from memrl.testing.models import byte_tokenizer
from memrl.testing.scripted import ScriptedPolicy
from memrl.types import MemoryOpType, TurnRole, TurnSpec

ADD, UPDATE = MemoryOpType.ADD, MemoryOpType.UPDATE
FACTS = ["Ann lives in Paris.", "Ann works as a baker."]


def turn(text: str, tid: str) -> TurnSpec:
    return TurnSpec(TurnRole.HISTORY, text, tid, speaker="Ann", timestamp="2023-01-01 10:00")


def shown_id(ctx_text: str, fact: str) -> str:
    """The local id the writer was shown ``fact`` under (the order is the retrieval's, nearest first)."""
    return re.search(rf"(\d+)\. \[[^\]]*\] {re.escape(fact)}", ctx_text)[1]


def _seeded(minilm, second_reply, **cfg):
    """A store holding FACTS, then one write of "I moved to Rome." answered by ``second_reply(ctx text)``."""
    replies = iter([f"ADD {FACTS[0]}", f"ADD {FACTS[1]}"])
    policy = ScriptedPolicy(
        byte_tokenizer(),
        lambda ctx: next(replies) if "I moved to Rome" not in ctx.text else second_reply(ctx.text),
    )
    system = MemorySystem(
        MemoryConfig(extractor="policy", neighbour_turns=0, **cfg),
        embedder=minilm,
        generate_text=policy_text_generator(policy),
    )
    mgr = system.manager("ep")
    system.write_batch([(mgr, [turn("I live in Paris.", "D1:1")])])
    system.write_batch([(mgr, [turn("I bake bread for a living.", "D1:2")])])
    res = system.write_batch([(mgr, [turn("I moved to Rome. I got a dog, Rex.", "D2:1")])])[0]
    return system, mgr, res


def test_an_update_far_from_every_shown_fact_is_kept_as_an_add_and_retires_nothing(minilm):
    system, mgr, res = _seeded(
        minilm,
        lambda text: f"UPDATE {shown_id(text, FACTS[0])} Ann has a dog named Rex.",
        update_min_cosine=0.67,
    )
    assert [o.op for o in res.ops] == [ADD]
    assert sorted(r.text for r in system.current_facts(mgr)) == sorted([*FACTS, "Ann has a dog named Rex."])
    assert not any(r.superseded for r in mgr.facts())
    # The writer's step keeps what it wrote (its op term scores that); the store got the ADD.
    assert [d.op for d in res.samples[0].ops.decisions] == [UPDATE]
    assert "kept as an ADD" in res.samples[0].resolved[0].extra["resolved"]
    assert system.metrics["memory/update_as_add"] == 1


def test_a_change_of_value_above_the_floor_still_supersedes(minilm):
    system, mgr, res = _seeded(
        minilm, lambda text: f"UPDATE {shown_id(text, FACTS[0])} Ann lives in Rome.", update_min_cosine=0.67
    )
    assert [o.op for o in res.ops] == [UPDATE] and res.samples[0].resolved is None
    assert sorted(r.text for r in system.current_facts(mgr)) == ["Ann lives in Rome.", FACTS[1]]
    assert [r.text for r in mgr.facts() if r.superseded] == [FACTS[0]]


def test_nearest_target_supersedes_the_shown_fact_nearest_the_text_not_the_written_id(minilm):
    wrong_id = {}

    def reply(text):
        wrong_id["id"] = shown_id(text, FACTS[1])  # the baker fact, not the one the change replaces
        return f"UPDATE {wrong_id['id']} Ann lives in Rome."

    system, mgr, res = _seeded(minilm, reply, update_target="nearest")
    assert sorted(r.text for r in system.current_facts(mgr)) == ["Ann lives in Rome.", FACTS[1]]
    assert [r.text for r in mgr.facts() if r.superseded] == [FACTS[0]]
    assert system.metrics["memory/update_retargeted"] == 1
    # As written (the default), the same reply retires the baker fact.
    system, mgr, _ = _seeded(minilm, reply)
    assert [r.text for r in mgr.facts() if r.superseded] == [FACTS[1]]


def test_an_add_at_the_ceiling_supersedes_the_shown_fact_it_restates_with_a_new_value(minilm):
    system, mgr, res = _seeded(minilm, lambda text: "ADD Ann lives in Rome.", add_supersede_cosine=0.75)
    assert [o.op for o in res.ops] == [UPDATE]
    assert sorted(r.text for r in system.current_facts(mgr)) == ["Ann lives in Rome.", FACTS[1]]
    assert [r.text for r in mgr.facts() if r.superseded] == [FACTS[0]]  # kept as history
    assert [d.op for d in res.samples[0].ops.decisions] == [ADD]  # the writer's step keeps what it wrote
    assert res.samples[0].resolved[0].extra["resolved"].startswith("ADD kept as an UPDATE")
    assert system.metrics["memory/add_as_update"] == 1 and "memory/update_retargeted" not in system.metrics
    # A new fact stays an ADD under the ceiling; without one, the change stays beside the stale fact.
    system, mgr, res = _seeded(minilm, lambda text: "ADD Ann has a dog named Rex.", add_supersede_cosine=0.75)
    assert [o.op for o in res.ops] == [ADD] and not any(r.superseded for r in mgr.facts())
    system, mgr, _ = _seeded(minilm, lambda text: "ADD Ann lives in Rome.")
    assert len(system.current_facts(mgr)) == 3


def test_resolution_embeds_a_batch_s_update_texts_in_one_call_and_nothing_without_an_update(counting):
    def run(reply, **cfg):
        replies = iter(["ADD Ann lives in Paris."] * 3)
        policy = ScriptedPolicy(
            byte_tokenizer(), lambda ctx: reply if "I moved to Rome" in ctx.text else next(replies)
        )
        system = MemorySystem(
            MemoryConfig(extractor="policy", **cfg),
            embedder=counting,
            generate_text=policy_text_generator(policy),
        )
        mgrs = [system.manager(f"ep{i}") for i in range(3)]
        system.write_batch([(m, [turn("I live in Paris.", "D1:1")]) for m in mgrs])
        counting.calls.clear()
        system.write_batch([(m, [turn("I moved to Rome.", "D2:1")]) for m in mgrs])
        return list(counting.calls)

    plain = run("UPDATE 0 Ann lives in Rome.")  # the neighbour lookup, then the written facts
    assert run("UPDATE 0 Ann lives in Rome.", update_target="nearest", update_min_cosine=0.6) == [3, 3, 3]
    assert plain == [3, 3]
    assert run("ADD Ann likes Rome.", update_target="nearest", update_min_cosine=0.6) == [3, 3]
    assert run("ADD Ann likes Rome.", add_supersede_cosine=0.75) == [
        3,
        3,
        3,
    ]  # under a ceiling ADDs are read too
    shown = (FactRecord(0, "ep", FACTS[0]),)
    adds = (FactDecision(ADD, text="Ann likes tea."),)
    assert resolve_updates(adds, shown, [], lambda fid: None, target="nearest", floor=0.9) == adds


def test_similarity_takes_the_best_pair_of_chunks():
    a = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert similarity(a, np.array([0.6, 0.8])) == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("cfg", "message"),
    [
        ({"update_target": "closest"}, "expected one of ('written', 'nearest', 'frame')"),
        ({"update_min_cosine": 1.5}, "[0, 1]"),
        ({"add_supersede_cosine": -0.1}, "memory.add_supersede_cosine=-0.1: must be a cosine in [0, 1]"),
    ],
)
def test_bad_settings_name_what_is_expected(cfg, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        MemoryConfig(**cfg)


def test_same_frame_is_one_relation_of_one_person_with_another_value():
    assert same_frame("Halima does surfing.", "Halima does badminton.")
    assert same_frame("Priya works as a nurse.", "priya works as an art teacher")
    assert same_frame("Ann's pet is called Rex.", "Ann's pet is called Bo.")
    assert not same_frame("Halima does surfing.", "Halima does surfing.")  # a repeat, not a change
    assert not same_frame("Bob does surfing.", "Halima does surfing.")  # another person
    assert not same_frame("Zeno plays the ukulele.", "Zeno is learning Greek.")  # another relation
    assert not same_frame(
        "Ann lives in Rome and works as a baker.", "Ann lives in Paris."
    )  # more than a value


def test_frame_target_supersedes_the_fact_restated_with_another_value_below_floor_and_ceiling(minilm):
    """MiniLM puts "Ann does judo." at 0.6 from "Ann does golf."; under a floor of 0.9 the UPDATE would be kept
    as an ADD, and under a ceiling of 0.9 the ADD would stand beside the stale fact."""
    golf, judo = (minilm.encode([t])[0] for t in ("Ann does golf.", "Ann does judo."))
    assert similarity(golf, judo) < 0.9
    shown = (FactRecord(0, "ep", "Ann lives in Paris."), FactRecord(1, "ep", "Ann does golf."))
    vectors = {r.fact_id: minilm.encode([r.text])[0] for r in shown}
    cases = [
        (FactDecision(ADD, text="Ann does judo."), "nearest", [ADD]),
        (FactDecision(ADD, text="Ann does judo."), "frame", [UPDATE]),
        (FactDecision(UPDATE, text="Ann does judo.", fact_id=0), "nearest", [ADD]),
        (FactDecision(UPDATE, text="Ann does judo.", fact_id=0), "frame", [UPDATE]),
    ]
    for d, target, ops in cases:
        (out,) = resolve_updates(
            (d,), shown, [judo], vectors.__getitem__, target=target, floor=0.9, ceiling=0.9
        )
        assert [out.op] == ops, (d, target)
        if target == "frame":
            assert out.fact_id == 1 and "restates fact 1 with another value" in out.extra["resolved"]
    # A new relation is no change under the frame rule: resolved by its cosine, as under nearest.
    new = FactDecision(ADD, text="Ann has a dog named Rex.")
    (out,) = resolve_updates(
        (new,),
        shown,
        [minilm.encode([new.text])[0]],
        vectors.__getitem__,
        target="frame",
        floor=0.6,
        ceiling=0.9,
    )
    assert out is new
