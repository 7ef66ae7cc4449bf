"""The held-out free-form chats: deterministic, LoCoMo's format, kinds on every turn and question, and nothing
shared with the synthetic task's vocabulary or the training small talk."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from memrl.adapters import CHATS_FIXTURE
from memrl.adapters import synthetic as syn
from memrl.adapters.chats import make_chats
from memrl.adapters.chats_text import ATTRS, NAMES, SMALL_TALK
from memrl.adapters.chats_train_text import ATTRS as TRAIN_ATTRS
from memrl.adapters.chats_train_text import NAMES as TRAIN_NAMES
from memrl.adapters.small_talk import SMALL_TALK as TRAINING_SMALL_TALK
from memrl.data.adapters import AdapterError, run_adapter
from memrl.memory.faithfulness import content_words, unsupported_words


def _chats(**options):
    return run_adapter("chats", None, split="test", options=options)[0]


def _histories(episodes):
    return list({ep.metadata["sample_id"]: ep.history for ep in episodes}.values())


def test_twenty_four_chats_ask_about_now_before_and_never_changed_facts():
    episodes = _chats()
    histories = _histories(episodes)
    assert len(histories) == 24
    assert Counter(ep.metadata["question_type"] for ep in episodes) == {
        "now": 72,
        "before": 72,
        "never_changed": 72,
    }
    kinds = Counter(t.metadata["turn_kind"] for h in histories for t in h)
    assert kinds["change"] == 72 and kinds["first"] > 150 and kinds["small_talk"] > 3 * kinds["first"]
    # A "before" question's answer is the value its change replaced; "now" the new one.
    for ep in episodes:
        turns = {t.turn_id: t for t in ep.history}
        (evidence,) = ep.metadata["evidence_turn_ids"]
        meta = turns[evidence].metadata
        assert meta["memory_value"] == ep.target_answer
        assert (
            meta["turn_kind"]
            == {"now": "change", "before": "first", "never_changed": "first"}[ep.metadata["question_type"]]
        )
        assert ep.target_answer.lower() in turns[evidence].text.lower()


def test_generation_is_deterministic_and_a_chat_does_not_depend_on_how_many_are_made():
    assert make_chats(3, seed=1) == make_chats(3, seed=1)
    assert make_chats(5, seed=1)[:3] == make_chats(3, seed=1)
    assert make_chats(2, seed=1) != make_chats(2, seed=2)
    # The fixture is the generator's output: regenerate it (memrl data make-chats) when the generator changes.
    assert json.loads(CHATS_FIXTURE.read_text()) == make_chats(2, seed=0)


def test_the_file_reads_as_locomo_and_as_chats():
    chats = run_adapter("chats", str(CHATS_FIXTURE), split="test")[0]
    locomo = run_adapter("locomo", str(CHATS_FIXTURE), split="all")[0]
    assert [e.final_query for e in chats] == [e.final_query for e in locomo]
    assert [e.target_answer for e in chats] == [e.target_answer for e in locomo]
    assert chats == _chats(num_chats=2)[: len(chats)]


def test_training_chats_share_no_word_with_the_held_out_ones():
    train = {a.name: a for a in TRAIN_ATTRS}
    assert set(train) >= {a.name for a in ATTRS}
    assert not {n.lower() for n in TRAIN_NAMES} & {n.lower() for n in NAMES}
    held_values = {v.lower() for a in ATTRS for v in a.values}
    train_values = {v.lower() for a in TRAIN_ATTRS for v in a.values}
    assert not held_values & train_values
    wordings = lambda attrs: {w for a in attrs for w in (*a.first, *a.change)}  # noqa: E731
    assert not wordings(ATTRS) & wordings(TRAIN_ATTRS)
    # The training small talk names none of the training values either (it would be a fact, not small talk).
    for line in TRAINING_SMALL_TALK:
        assert not set(content_words(line)) & train_values, line


def test_training_splits_are_chats_of_the_training_pool_with_gold_operations():
    train = run_adapter("chats", None, split="train", options={"num_chats": 4, "num_sessions": 3,
                                                               "turns_per_session": 8, "facts_per_speaker": 3})[0]  # fmt: skip
    validation = run_adapter("chats", None, split="validation", options={"num_chats": 4})[0]
    speakers = {s for ep in train + validation for s in ep.metadata["speakers"]}
    assert speakers <= set(TRAIN_NAMES)
    assert {ep.final_query for ep in train} != {ep.final_query for ep in validation}
    histories = _histories(train)
    assert all(len(h) == 24 for h in histories)
    ops = Counter(t.metadata["memory_op"] for h in histories for t in h)
    assert ops["ADD"] == 4 * 6 and ops["UPDATE"] == 4 * 3 and ops["NOOP"] == 4 * 24 - 36
    for history in histories:
        for turn in history:
            if turn.metadata["turn_kind"] != "small_talk":
                assert unsupported_words(turn.metadata["memory_fact"], [turn]) == (), turn.text


def test_a_training_split_refuses_held_out_chats_and_test_refuses_training_chats(tmp_path):
    held_out, training = tmp_path / "held_out.json", tmp_path / "train.json"
    held_out.write_text(json.dumps(make_chats(1)))
    training.write_text(json.dumps(make_chats(1, split="train")))
    with pytest.raises(AdapterError, match=r"held_out.json.*split.*never train on"):
        run_adapter("chats", str(held_out), split="train")
    with pytest.raises(AdapterError, match=r"train.json.*split.*a held-out chat"):
        run_adapter("chats", str(training), split="test")
    assert run_adapter("chats", str(training), split="train")[0]
    assert len(run_adapter("chats", str(held_out), split="all")[0]) == len(
        run_adapter("chats", str(held_out), split="test")[0]
    )
    with pytest.raises(ValueError, match="num_sessions shape generated chats"):
        run_adapter("chats", str(training), split="train", options={"num_sessions": 3})


def test_a_turn_without_a_known_kind_is_a_located_error(tmp_path):
    records = make_chats(1)
    records[0]["conversation"]["session_1"][2]["kind"] = "chit-chat"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(records))
    with pytest.raises(AdapterError, match=r"session_1\[2\]\.kind.*small_talk, first, change"):
        run_adapter("chats", str(path), split="test")


def test_no_word_is_shared_with_the_synthetic_task_or_the_training_small_talk():
    synthetic_values = {
        v.lower() for pool in (syn._COLOURS, syn._CITIES, syn._PET_NAMES, syn._JOBS) for v in pool
    }
    values = {v.lower() for a in ATTRS for v in a.values}
    assert not values & synthetic_values
    assert not {n.lower() for n in NAMES} & {n.lower() for n in syn._NAMES}
    assert not set(SMALL_TALK) & (set(TRAINING_SMALL_TALK) | set(syn._CHITCHAT))
    # Small talk (held out, and the training pool) names no value and no number.
    for line in SMALL_TALK + TRAINING_SMALL_TALK:
        words = set(content_words(line.format(other="")))
        assert not words & (values | synthetic_values), line
        assert not any(w.isdigit() for w in words), line


def test_every_gold_fact_is_supported_by_its_turn_and_small_talk_supports_none():
    for history in _histories(_chats(num_chats=6)):
        for turn in history:
            meta = turn.metadata
            if meta["turn_kind"] == "small_talk":
                assert unsupported_words(f"{turn.speaker} lives in Porto.", [turn]) == ("porto",)
            else:
                assert unsupported_words(meta["memory_fact"], [turn]) == (), turn.text


def test_novel_kind_chats_ask_about_kinds_no_training_chat_states_in_words_of_their_own():
    from memrl.adapters.chats_novel_text import ATTRS as NOVEL_ATTRS

    episodes = _chats(kinds="novel")
    assert Counter(ep.metadata["question_type"] for ep in episodes)["never_changed"] == 72
    assert not {a.name for a in NOVEL_ATTRS} & {a.name for a in TRAIN_ATTRS + ATTRS}
    assert {s for ep in episodes for s in ep.metadata["speakers"]} <= set(NAMES)
    novel_values = {v.lower() for a in NOVEL_ATTRS for v in a.values}
    seen_values = {v.lower() for a in ATTRS + TRAIN_ATTRS for v in a.values}
    assert not novel_values & seen_values
    wordings = lambda attrs: {w for a in attrs for w in (*a.first, *a.change)}  # noqa: E731
    assert not wordings(NOVEL_ATTRS) & (wordings(ATTRS) | wordings(TRAIN_ATTRS))
    for line in SMALL_TALK:
        assert not set(content_words(line.format(other=""))) & novel_values, line
    asked = Counter()
    for ep in episodes:
        turns = {t.turn_id: t for t in ep.history}
        (evidence,) = ep.metadata["evidence_turn_ids"]
        meta = turns[evidence].metadata
        assert (
            meta["memory_value"] == ep.target_answer
            and ep.target_answer.lower() in turns[evidence].text.lower()
        )
        asked[meta["memory_attr"]] += 1
    assert set(asked) <= {a.name for a in NOVEL_ATTRS} and len(asked) == len(NOVEL_ATTRS)
    for history in _histories(episodes):
        for turn in history:
            if turn.metadata["turn_kind"] != "small_talk":
                assert unsupported_words(turn.metadata["memory_fact"], [turn]) == (), turn.text
    # Held out apart from the seen-kind chats: other ids, other draws.
    assert not {ep.metadata["sample_id"] for ep in episodes} & {ep.metadata["sample_id"] for ep in _chats()}


def test_novel_kinds_are_never_a_training_split_and_read_back_from_a_file(tmp_path):
    with pytest.raises(ValueError, match="novel' are held out"):
        run_adapter("chats", None, split="train", options={"kinds": "novel"})
    with pytest.raises(ValueError, match="kinds 'unseen'; valid: seen, novel"):
        _chats(kinds="unseen")
    path = tmp_path / "novel.json"
    path.write_text(json.dumps(make_chats(2, kinds="novel")))
    assert run_adapter("chats", str(path), split="test")[0] == _chats(num_chats=2, kinds="novel")
    with pytest.raises(ValueError, match="kinds shape generated chats"):
        run_adapter("chats", str(path), split="test", options={"kinds": "novel"})
