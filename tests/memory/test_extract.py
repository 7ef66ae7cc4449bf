"""Rule and llm fact extraction; the llm path through a deterministic scripted text generator."""

from __future__ import annotations

import logging

import pytest

from memrl.memory.config import MemoryConfig
from memrl.memory.extract import (
    ExtractionRequest,
    LlmOutputError,
    parse_decisions,
    rule_fact_texts,
)
from memrl.memory.extractors import EXTRACTORS, writes_steps
from memrl.memory.manager import MemorySystem
from memrl.memory.store import FactRecord
from memrl.types import MemoryOpType, TurnSpec


def turn(text, tid="D1:1", speaker="Ann", ts="1 May 2023", **meta):
    return TurnSpec("history", text, tid, speaker, ts, meta)


def test_rule_facts_are_speaker_attributed_with_caption():
    t = turn("I adopted a dog. His name is Rex!", blip_caption="a photo of a puppy")
    assert rule_fact_texts(t) == [
        "Ann: I adopted a dog. His name is Rex! [shares a photo: a photo of a puppy]"
    ]
    assert rule_fact_texts(turn("", blip_caption="a cat")) == ["Ann: [shares a photo: a cat]"]
    assert rule_fact_texts(turn("   ")) == []


def test_rule_extractor_adds_one_fact_per_turn_and_noops_empty_turns():
    ex = EXTRACTORS.get("rule")(MemoryConfig(), None)
    out = ex.extract([ExtractionRequest(turn("I like tea.")), ExtractionRequest(turn(""))])
    assert [d.op for d in out[0]] == [MemoryOpType.ADD] and out[0][0].text == "Ann: I like tea."
    assert out[1][0].op is MemoryOpType.NOOP and "empty" in out[1][0].reason


NEIGHBOURS = (
    FactRecord(11, "ep", "Ann lives in Oslo."),
    FactRecord(42, "ep", "Ann has a dog named Rex."),
)


def test_parse_decisions_maps_local_ids_to_fact_ids():
    reply = 'Sure! [{"op": "UPDATE", "id": 0, "text": "Ann lives in Bergen."}, {"event": "delete", "id": 1}, {"op": "ADD", "text": "Ann got a cat."}]'
    ds = parse_decisions(reply, NEIGHBOURS, "Ann")
    assert [(d.op, d.fact_id) for d in ds] == [
        (MemoryOpType.UPDATE, 11),
        (MemoryOpType.DELETE, 42),
        (MemoryOpType.ADD, None),
    ]
    wrapped = parse_decisions('{"operations": [{"op": "NOOP", "reason": "chit-chat"}]}', NEIGHBOURS, "Ann")
    assert wrapped[0].op is MemoryOpType.NOOP and wrapped[0].reason == "chit-chat"


def test_parse_decisions_reads_the_first_json_value_and_ignores_what_follows():
    # SmolLM2-135M writes a complete list, then repeats the prompt (with more brackets) until max_tokens.
    reply = '[{"op": "NOOP"}]\n\nThe market was busy.\n\nOperations:\n- ADD ... [{"op": "ADD", "text": "Ann'
    assert [d.op for d in parse_decisions(reply, NEIGHBOURS, "Ann")] == [MemoryOpType.NOOP]
    first = parse_decisions('ok: {"op": "DELETE", "id": 1} and [1, 2]', NEIGHBOURS, "Ann")
    assert [(d.op, d.fact_id) for d in first] == [(MemoryOpType.DELETE, 42)]


@pytest.mark.parametrize(
    "reply,match",
    [
        ("I think Ann moved.", "no JSON"),
        ('[{"op": "ADD", "text": "x"', "invalid JSON"),  # cut off by max_tokens
        ('[{"op": "ADD" "text": "x"}]', "invalid JSON"),
        ('[{"op": "MERGE", "text": "x"}]', "not ADD/UPDATE/DELETE/NOOP"),
        ('[{"op": "UPDATE", "id": 7, "text": "x"}]', "not one of the shown ids"),
        ('[{"op": "DELETE", "id": "0"}]', "not one of the shown ids"),
        ('[{"op": "ADD"}]', "ADD without text"),
        ('["ADD Ann likes tea"]', "expected an object"),
        ('"just a string"', "no JSON"),
    ],
)
def test_malformed_replies_raise_llm_output_error(reply, match):
    with pytest.raises(LlmOutputError, match=match):
        parse_decisions(reply, NEIGHBOURS, "Ann")


class Scripted:
    """Deterministic text generator: returns queued replies and records the prompts it saw."""

    def __init__(self, replies):
        self.replies = list(replies)
        self.prompts: list[list[str]] = []

    def __call__(self, prompts):
        self.prompts.append(list(prompts))
        return [self.replies.pop(0) for _ in prompts]


def test_llm_extractor_add_update_delete_and_malformed_noop(counting, caplog):
    gen = Scripted(
        [
            '[{"op": "ADD", "text": "Ann lives in Oslo."}, {"op": "ADD", "text": "Ann has a dog named Rex."}]',
            '[{"op": "UPDATE", "id": 0, "text": "Ann lives in Bergen."}]',
            "sorry, I cannot help with that",
            '[{"op": "DELETE", "id": 0}]',
        ]
    )
    system = MemorySystem(MemoryConfig(extractor="llm"), embedder=counting, generate_text=gen)
    mgr = system.manager("ep")
    ops = mgr.extract_facts(turn("I live in Oslo with my dog Rex.", "D1:1"))
    assert [o.op for o in ops] == [MemoryOpType.ADD, MemoryOpType.ADD]
    oslo_id, rex_id = ops[0].fact_ids[0], ops[1].fact_ids[0]

    ops = mgr.extract_facts(turn("I just moved to Bergen!", "D2:1", ts="3 June 2023"))
    assert ops[0].op is MemoryOpType.UPDATE and ops[0].fact_ids == (oslo_id,)
    assert "Ann lives in Oslo." in gen.prompts[1][0]  # the most similar existing fact was shown as id 0
    assert gen.prompts[1][0].index("Ann lives in Oslo.") < gen.prompts[1][0].index("Ann has a dog")
    rec = system.store.get("ep", oslo_id)
    assert (
        rec.text == "Ann lives in Bergen."
        and rec.source_ids == ("D1:1", "D2:1")
        and rec.timestamp == "3 June 2023"
    )

    with caplog.at_level(logging.WARNING, logger="memrl.memory.extract"):
        ops = mgr.extract_facts(turn("lol", "D2:2"))
    assert ops[0].op is MemoryOpType.NOOP and "malformed llm output" in ops[0].text
    assert "D2:2" in caplog.text and "malformed" in caplog.text

    ops = mgr.extract_facts(turn("Rex ran away, I no longer have a dog.", "D3:1"))
    assert ops[0].op is MemoryOpType.DELETE and ops[0].fact_ids == (rex_id,)
    assert [r.fact_id for r in mgr.facts()] == [oslo_id]
    assert [o.op for o in mgr.memory_ops] == ["ADD", "ADD", "UPDATE", "NOOP", "DELETE"]
    assert system.metrics["memory/add"] == 2 and system.metrics["memory/noop"] == 1


def test_llm_extractor_needs_a_generator():
    with pytest.raises(ValueError, match="policy_text_generator"):
        EXTRACTORS.get("llm")(MemoryConfig(extractor="llm"), None)


def test_extractor_registry_lists_its_choices_and_says_which_write_trainable_steps():
    assert EXTRACTORS.names() == ["gold", "llm", "policy", "rule"]
    assert [n for n in EXTRACTORS.names() if writes_steps(n)] == ["policy"]
    with pytest.raises(KeyError, match="valid choices: gold, llm, policy, rule"):
        EXTRACTORS.get("mem0")
