"""The policy as memory writer: parsing operations, applying them (superseding updates), store forks."""

from __future__ import annotations

import pytest

from memrl.episode.config import EpisodeConfig
from memrl.episode.prompt import PromptBuilder, as_prompt_fact
from memrl.memory.config import MemoryConfig
from memrl.memory.llm import policy_text_generator
from memrl.memory.manager import MemorySystem
from memrl.memory.store import FactRecord
from memrl.memory.writer import FORMAT_REASON, WriteRequest, parse_ops, render_user, turn_line
from memrl.testing.models import byte_tokenizer
from memrl.testing.scripted import ScriptedPolicy
from memrl.types import MemoryOpType, TurnRole, TurnSpec

ADD, UPDATE, DELETE, NOOP = MemoryOpType.ADD, MemoryOpType.UPDATE, MemoryOpType.DELETE, MemoryOpType.NOOP


def fact(fid: int, text: str) -> FactRecord:
    return FactRecord(fid, "ep", text, timestamp="2023-01-01")


def turn(text: str, tid: str, when: str = "2023-01-01 10:00", speaker: str = "Ann") -> TurnSpec:
    return TurnSpec(TurnRole.HISTORY, text, tid, speaker=speaker, timestamp=when)


def test_parse_valid_lines_map_local_ids_to_fact_ids():
    shown = (fact(41, "Mia lives in Paris."), fact(7, "Mia is a baker."))
    got = parse_ops("ADD Omar has 3 pets.\nUPDATE 0 Mia lives in Rome.\nDELETE 1\nNOOP", shown)
    assert got.valid
    assert [d.op for d in got.decisions] == [ADD, UPDATE, DELETE, NOOP]
    assert got.decisions[1].fact_id == 41 and got.decisions[1].supersede
    assert got.decisions[1].text == "Mia lives in Rome."
    assert got.decisions[2].fact_id == 7


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        ("Sure! Here is the memory.", "does not start with ADD/UPDATE/DELETE/NOOP"),
        ("UPDATE 5 Mia lives in Rome.", "id 5 is not one of the shown ids 0..0"),
        ("UPDATE Mia lives in Rome.", "needs a shown id"),
        ("ADD", "ADD without a fact"),
        ("UPDATE 0", "UPDATE without the new fact"),
        ("", "empty reply"),
    ],
)
def test_malformed_operation_becomes_noop_with_its_reason(reply, why):
    got = parse_ops(reply, (fact(1, "Mia lives in Paris."),))
    assert not got.valid and why in got.errors[0]
    assert got.decisions[0].op is NOOP
    assert got.decisions[0].reason.startswith(FORMAT_REASON) and why in got.decisions[0].reason


def test_too_many_lines_are_cut_and_counted_as_a_format_error():
    got = parse_ops("\n".join(f"ADD Ann has {i} pets." for i in range(12)), ())
    assert len(got.decisions) == 8 and any("more than 8" in e for e in got.errors)


def test_a_looping_reply_adds_its_line_once_and_loses_its_format_term():
    got = parse_ops("ADD Ann lives in Oslo.\n" * 6 + "NOOP", ())
    assert [d.op for d in got.decisions] == [ADD, NOOP] and not got.valid
    assert got.errors == ("5 repeated line(s) ignored",)


def test_render_user_shows_local_ids_and_the_new_turns():
    text = render_user(WriteRequest((turn("I moved to Rome.", "D2:1"),), (fact(41, "Ann lives in Paris."),)))
    assert "0. [2023-01-01] Ann lives in Paris." in text
    assert "[2023-01-01 10:00] Ann: I moved to Rome." in text and text.endswith("Operations:")


def _system(minilm, script, **cfg) -> MemorySystem:
    policy = ScriptedPolicy(byte_tokenizer(), script)
    cfg = MemoryConfig(extractor="policy", **cfg)
    return MemorySystem(cfg, embedder=minilm, generate_text=policy_text_generator(policy))


def test_update_supersedes_keeps_history_and_retrieval_prefers_the_current_value(minilm):
    replies = iter(["ADD Ann lives in Paris.", "UPDATE 0 Ann lives in Rome."])
    system = _system(minilm, lambda ctx: next(replies), neighbour_turns=0)  # facts one by one
    mgr = system.manager("ep")
    first = system.write_batch([(mgr, [turn("I live in Paris.", "D1:1", "2023-01-01 10:00")])])[0]
    second = system.write_batch([(mgr, [turn("I moved to Rome.", "D2:1", "2023-03-05 09:00")])])[0]
    assert [o.op for o in first.ops] == [ADD] and [o.op for o in second.ops] == [UPDATE]
    old, new = second.ops[0].fact_ids
    records = {r.fact_id: r for r in mgr.facts()}
    assert records[old].text == "Ann lives in Paris." and records[old].superseded
    assert (
        records[old].extra["valid_until"] == "2023-03-05 09:00" and records[old].extra["superseded_by"] == new
    )
    assert [r.text for r in system.current_facts(mgr)] == ["Ann lives in Rome."]
    assert second.facts_before == (old,) and second.facts_after == (new,)
    now = mgr.retrieve("Where does Ann live?", k=2)
    assert [h.fact_id for h in now] == [new]  # the stale value is not shown beside the current one
    before = mgr.retrieve("Where did Ann live before?", k=2)
    past = next(h for h in before if h.fact_id == old)
    assert "no longer true since 2023-03-05 09:00" in past.text


def test_a_written_fact_is_attributed_to_its_subject_not_to_whoever_said_it(minilm):
    # Dario tells about Omar: the fact names Omar; labelling it "Dario:" made the answerer read it as Dario's.
    system = _system(minilm, lambda ctx: "ADD Omar lives in Nairobi.", neighbour_turns=0)
    mgr = system.manager("ep")
    said = turn("Omar lives in Nairobi.", "D1:1", speaker="Dario")
    system.write_batch([(mgr, [said])])
    [stored] = mgr.facts()
    assert stored.text == "Omar lives in Nairobi." and stored.speaker == "" and stored.source_ids == ("D1:1",)
    [hit] = mgr.retrieve("Which city does Dario live in?", k=1)
    tok = byte_tokenizer()
    system_msg = PromptBuilder(EpisodeConfig(), tok).render_system([as_prompt_fact(hit)], "", [])
    assert "- [2023-01-01 10:00] Omar lives in Nairobi." in system_msg and "Dario" not in system_msg


def test_a_malformed_write_is_a_logged_noop_and_never_raises(minilm):
    system = _system(minilm, lambda ctx: "I think Ann likes Rome")
    mgr = system.manager("ep")
    res = system.write_batch([(mgr, [turn("I moved to Rome.", "D1:1")])])[0]
    assert [o.op for o in res.ops] == [NOOP] and FORMAT_REASON in res.ops[0].text
    assert res.samples[0].ops.errors and mgr.facts() == []
    assert mgr.memory_ops[-1].op is NOOP


def test_writes_of_a_batch_are_one_generate_call_and_two_encode_calls(counting):
    policy = ScriptedPolicy(
        byte_tokenizer(), lambda ctx: ["ADD Ann is a baker.", "ADD Bo is a pilot."][ctx.sample_index]
    )
    calls = []
    inner = policy.generate
    policy.generate = lambda reqs: calls.append(len(reqs)) or inner(reqs)
    system = MemorySystem(
        MemoryConfig(extractor="policy"), embedder=counting, generate_text=policy_text_generator(policy)
    )
    items = [(system.manager(f"ep{i}"), [turn("Hello.", "D1:1")]) for i in range(3)]
    out = system.write_batch(items, [1, 2, 1], temperature=1.0)  # the second write is a snapshot group
    assert calls == [3] and len(out) == 3
    # One encode for the neighbour lookup, one for every fact written: the forks' and the episodes' own.
    assert counting.calls == [3, 5]  # item 1: its two forks and its own store
    assert [len(system.current_facts(m)) for m, _ in items] == [1, 1, 1]
    assert [len(system.current_facts(system.manager(ns))) for ns in out[1].alternatives] == [1, 1]
    assert all(len(r.samples[0].response_ids) == len(r.samples[0].logprobs) > 0 for r in out)


def test_snapshot_alternatives_start_from_one_state_and_never_touch_each_other(minilm):
    def script(ctx):
        if "I moved to Rome." in ctx.text:
            return ["UPDATE 0 Ann lives in Rome.", "ADD Ann likes Rome.", "DELETE 0"][ctx.sample_index]
        return "ADD Ann lives in Paris."

    system = _system(minilm, script)
    mgr = system.manager("ep")
    system.write_batch([(mgr, [turn("I live in Paris.", "D1:1")])])
    before = {r.text for r in mgr.facts()}
    res = system.write_batch([(mgr, [turn("I moved to Rome.", "D2:1")])], [3], temperature=1.0)[0]
    assert len(res.alternatives) == 3
    forks = [system.manager(ns) for ns in res.alternatives]
    # Every fork holds the state before the write plus its own reply's operations, and nothing of the others'.
    texts = [sorted(r.text for r in system.current_facts(f)) for f in forks]
    assert texts == [["Ann lives in Rome."], ["Ann likes Rome.", "Ann lives in Paris."], []]
    # Replies 0 and 1 keep the earlier fact (superseded or current); reply 2 deleted it, in its fork only.
    assert [{r.text for r in f.facts()} >= before for f in forks] == [True, True, False]
    assert not {r.fact_id for r in mgr.facts()} & {r.fact_id for f in forks for r in f.facts()}
    # The episode's own store got reply 0 only.
    assert [r.text for r in system.current_facts(mgr)] == ["Ann lives in Rome."]
    assert sum(1 for r in mgr.facts() if r.superseded) == 1
    for ns in res.alternatives:
        system.release(ns)
    assert [r.text for r in system.current_facts(mgr)] == ["Ann lives in Rome."]


def test_policy_extractor_without_a_client_names_the_fix():
    with pytest.raises(ValueError, match="policy_text_generator"):
        MemorySystem(MemoryConfig(extractor="policy"), embedder=None or _NullEmbedder())


class _NullEmbedder:
    dim = 4

    def encode(self, texts):  # pragma: no cover - never reached
        raise AssertionError

    def count_tokens(self, texts):  # pragma: no cover
        return [0 for _ in texts]


def test_the_nearest_current_facts_are_shown_nearest_first(minilm):
    facts = [
        "Tom is a baker.",
        "Ann has 2 siblings.",
        "Bob has 3 pets.",
        "Eve likes red.",
        "Ann lives in Paris.",
    ]
    replies = iter([f"ADD {f}" for f in facts] + ["NOOP"])
    system = _system(minilm, lambda ctx: next(replies), write_neighbours=3)
    mgr = system.manager("ep")
    for i, f in enumerate(facts):
        system.write_batch([(mgr, [turn(f, f"D1:{i + 1}")])])
    new = turn("Ann moved to Rome.", "D2:1")
    res = system.write_batch([(mgr, [new])])[0]
    texts = [r.text for r in res.neighbours]
    # The nearest three, nearest first, whenever they were written: the fact a change replaces is usually 0.
    nearest = mgr.facts()
    vec = minilm.encode([turn_line(new)])
    ranked = [f.text for fid, _ in system.store.search("ep", vec, 5)[0] for f in nearest if f.fact_id == fid]
    assert texts == ranked[:3] and texts[0] == "Ann lives in Paris." == facts[-1]


def test_a_write_that_cannot_fit_the_model_window_stops_with_the_setting_to_change(minilm):
    """The backend would abort an over-long write and leave memory empty without a word (a whole LoCoMo
    conversation in one write): the writer names the turns, the sizes and episode.ingest_chunk_turns instead."""
    policy = ScriptedPolicy(byte_tokenizer(), lambda ctx: "NOOP")
    policy.max_model_len = 1200  # bytes: the instructions alone are ~500
    system = MemorySystem(
        MemoryConfig(extractor="policy"), embedder=minilm, generate_text=policy_text_generator(policy)
    )
    mgr = system.manager("ep")
    turns = [turn(f"I went hiking with my dog on day {i}.", f"D1:{i}") for i in range(1, 20)]
    with pytest.raises(
        ValueError, match=r"19 turn\(s\) \(D1:1 \.\. D1:19\).*max_model_len=1200.*ingest_chunk_turns"
    ):
        system.write_batch([(mgr, turns)])
    assert system.write_batch([(mgr, turns[:1])])[0].samples[0].ops.decisions[0].op is NOOP  # one turn fits


def test_keep_turns_stores_each_verbatim_turn_before_what_was_written_about_it(minilm):
    seen = []
    system = _system(minilm, lambda ctx: "ADD Ann lives in Paris.", keep_turns=True, write_neighbours=5)
    real = system.extractor.sample
    system.extractor.sample = lambda reqs, *a: seen.append([r.neighbours for r in reqs]) or real(reqs, *a)
    mgr = system.manager("ep")
    first = system.write_batch([(mgr, [turn("I live in Paris.", "D1:1"), turn("Yes, Paris.", "D1:2")])])[0]
    # The writer read the store as it was before its turns: nothing yet.
    assert seen[0] == [()]
    assert [r.text for r in mgr.facts()] == [
        "Ann: I live in Paris.",
        "Ann: Yes, Paris.",
        "Ann lives in Paris.",
    ]
    assert [o.op for o in first.ops] == [ADD]  # the write's own ops; the kept turns are logged apart
    assert sum(o.op is ADD for o in mgr.memory_ops) == 3
    system.write_batch([(mgr, [turn("Nice weather.", "D1:3")])])
    # The next write is shown the kept turns too (current facts of the episode).
    assert {f.text for f in seen[1][0]} >= {"Ann: I live in Paris.", "Ann lives in Paris."}
    assert mgr.facts()[3].text == "Ann: Nice weather." and len(mgr.facts()) == 5


def test_writer_reads_only_written_facts_without_verbatim_neighbours(minilm):
    seen = []
    replies = iter(["ADD Ann lives in Paris.", "NOOP", "NOOP", "NOOP"])
    system = _system(
        minilm,
        lambda ctx: next(replies),
        keep_turns=True,
        write_neighbours=5,
        write_neighbours_verbatim=False,
    )
    real = system.extractor.sample
    system.extractor.sample = lambda reqs, *a: seen.append([r.neighbours for r in reqs]) or real(reqs, *a)
    mgr = system.manager("ep")
    system.write_batch([(mgr, [turn("I live in Paris.", "D1:1"), turn("Yes, Paris.", "D1:2")])])
    system.write_batch([(mgr, [turn("Nice weather.", "D1:3")])])
    # The kept turns are in the store (the answer reads them) but the writer is shown only what was written.
    assert [f.text for f in seen[1][0]] == ["Ann lives in Paris."]
    assert len(mgr.facts()) == 4
    # Forks keep the mark: a sampled write's fork still hides its kept turns from the next write.
    [res] = system.write_batch([(mgr, [turn("I bake.", "D1:4")])], [2], temperature=1.0)
    fork = system.manager(res.alternatives[0])
    assert [f.text for f in system.current_neighbours(fork, system.embedder.encode(["Paris"]), 5)] == [
        "Ann lives in Paris."
    ]


def test_keep_turns_holds_in_every_fork_of_a_sampled_write(minilm):
    system = _system(minilm, lambda ctx: ["ADD Ann is a baker.", "NOOP"][ctx.sample_index], keep_turns=True)
    mgr = system.manager("ep")
    [res] = system.write_batch([(mgr, [turn("I bake bread.", "D1:1")])], [2], temperature=1.0)
    forks = [[r.text for r in system.current_facts(system.manager(ns))] for ns in res.alternatives]
    assert forks == [["Ann: I bake bread.", "Ann is a baker."], ["Ann: I bake bread."]]
