"""LoCoMo adapter on the bundled fixture and (when present) the real locomo10.json."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from memrl.adapters import LOCOMO_FIXTURE
from memrl.data.adapters import run_adapter
from memrl.types import TurnRole

REAL = Path("/work/shared/data/locomo/locomo10.json")


def _load(path=LOCOMO_FIXTURE, split="all", **options):
    return run_adapter("locomo", str(path), split=split, options=options)


def test_fixture_every_qa_is_an_episode_over_the_whole_conversation():
    raw = json.loads(LOCOMO_FIXTURE.read_text())[0]
    episodes, report = _load()
    assert report.skipped == 0
    assert len(episodes) == len(raw["qa"]) == 8
    conv = raw["conversation"]
    dialog = conv["session_1"] + conv["session_2"]
    for ep, qa in zip(episodes, raw["qa"], strict=True):
        assert ep.final_query == qa["question"] == ep.target.text
        assert ep.target.role is TurnRole.TARGET
        assert [t.turn_id for t in ep.history] == [d["dia_id"] for d in dialog]
        assert [t.speaker for t in ep.history] == [d["speaker"] for d in dialog]
        assert ep.metadata["category"] == qa["category"]
        assert ep.metadata["evidence"] == qa["evidence"]
        assert set(ep.metadata["evidence_turn_ids"]) == set(qa["evidence"])
        assert ep.metadata["session_dates"] == {
            "session_1": conv["session_1_date_time"],
            "session_2": conv["session_2_date_time"],
        }
        assert ep.group_id == ep.episode_id
    dates = {t.turn_id.split(":")[0]: t.timestamp for t in episodes[0].history}
    assert dates == {"D1": conv["session_1_date_time"], "D2": conv["session_2_date_time"]}


def test_numeric_answers_become_text_and_category_5_is_adversarial():
    episodes, _ = _load()
    by_q = {e.final_query: e for e in episodes}
    assert by_q["When did Melanie paint a sunrise?"].target_answer == "2022"
    adversarial = [e for e in episodes if e.metadata["category"] == 5]
    assert len(adversarial) == 2
    for ep in adversarial:
        assert ep.target_answer is None and ep.metadata["adversarial"] is True
        assert ep.metadata["adversarial_answer"]
    assert all(e.target_answer for e in episodes if e.metadata["category"] != 5)


def test_captions_appended_unless_disabled():
    raw = json.loads(LOCOMO_FIXTURE.read_text())[0]["conversation"]
    captioned = {
        d["dia_id"]: d["blip_caption"] for d in raw["session_1"] + raw["session_2"] if "blip_caption" in d
    }
    assert captioned
    with_caps, _ = _load()
    without, _ = _load(include_captions=False)
    turns = {t.turn_id: t.text for t in with_caps[0].history}
    plain = {t.turn_id: t.text for t in without[0].history}
    for tid, caption in captioned.items():
        assert turns[tid].endswith(f"[shares photo: {caption}]")
        assert "shares photo" not in plain[tid]


def test_messy_evidence_strings_are_normalised_not_dropped(tmp_path):
    raw = json.loads(LOCOMO_FIXTURE.read_text())
    raw[0]["qa"][0]["evidence"] = ["D1:3; D2:1", "D", "D9:99"]
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps(raw))
    episodes, _ = _load(path)
    meta = episodes[0].metadata
    assert meta["evidence"] == ["D1:3", "D2:1", "D9:99"]
    assert meta["evidence_turn_ids"] == ["D1:3", "D2:1"]
    assert meta["evidence_unresolved"] == ["D", "D9:99"]


def test_train_test_split_by_conversation(tmp_path):
    raw = json.loads(LOCOMO_FIXTURE.read_text())
    convs = []
    for i in range(12):
        conv = json.loads(json.dumps(raw[0]))
        conv["sample_id"] = f"conv-{i}"
        convs.append(conv)
    path = tmp_path / "many.json"
    path.write_text(json.dumps(convs))
    train, _ = _load(path, split="train")
    test, _ = _load(path, split="test")
    every, _ = _load(path, split="all")
    ids = lambda eps: {e.metadata["sample_id"] for e in eps}  # noqa: E731
    assert ids(train) and ids(test) and not ids(train) & ids(test)
    assert len(train) + len(test) == len(every) == 12 * 8


@pytest.mark.skipif(not REAL.is_file(), reason="real LoCoMo file not present")
def test_real_file_gives_1986_episodes():
    episodes, report = _load(REAL)
    assert len(episodes) == 1986 and report.skipped == 0
    cats = Counter(e.metadata["category"] for e in episodes)
    assert cats[5] == 446 == sum(e.metadata["adversarial"] for e in episodes)
    assert len({e.episode_id for e in episodes}) == 1986
    assert len({e.metadata["sample_id"] for e in episodes}) == 10


def _many(tmp_path, names, name="many.json"):
    raw = json.loads(LOCOMO_FIXTURE.read_text())[0]
    convs = []
    for sid in names:
        conv = json.loads(json.dumps(raw))
        conv["sample_id"] = sid
        convs.append(conv)
    path = tmp_path / name
    path.write_text(json.dumps(convs))
    return path


def test_memory_r1_split_names_conversations_not_positions(tmp_path):
    names = ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43"]
    forward = _many(tmp_path, names, "forward.json")
    shuffled = _many(tmp_path, [names[i] for i in (3, 1, 4, 0, 2)], "shuffled.json")
    ids = lambda eps: [e.episode_id for e in eps]  # noqa: E731
    convs = lambda eps: {e.metadata["sample_id"] for e in eps}  # noqa: E731
    splits = {}
    for split in ("train", "validation", "test"):
        a, _ = _load(forward, split=split, split_scheme="memory_r1")
        b, _ = _load(shuffled, split=split, split_scheme="memory_r1")
        assert ids(a) == ids(b) and a
        splits[split] = convs(a)
    assert splits == {
        "train": {"conv-26"},
        "validation": {"conv-30"},
        "test": {"conv-41", "conv-42", "conv-43"},
    }
    sample_a, _ = _load(forward, split="test", split_scheme="memory_r1", test_sample=0.5)
    sample_b, _ = _load(shuffled, split="test", split_scheme="memory_r1", test_sample=0.5)
    assert ids(sample_a) == ids(sample_b)


def test_test_sample_keeps_every_category_of_every_conversation(tmp_path):
    path = _many(tmp_path, ["conv-41", "conv-42"])
    full, _ = _load(path, split="test", split_scheme="memory_r1")
    half, _ = _load(path, split="test", split_scheme="memory_r1", test_sample=0.5)
    strata = lambda eps: Counter((e.metadata["sample_id"], e.metadata["category"]) for e in eps)  # noqa: E731
    assert set(strata(half)) == set(strata(full))
    for key, n in strata(full).items():
        assert strata(half)[key] == -(-n // 2)  # half of each stratum, rounded up
    train, _ = _load(_many(tmp_path, ["conv-26"], "one.json"), split="train", split_scheme="memory_r1")
    assert len(train) == 8  # the sample applies to the test split only


def test_validation_needs_the_memory_r1_scheme_and_abstention_answer_is_the_cat5_gold():
    with pytest.raises(ValueError, match="split_scheme: memory_r1"):
        _load(split="validation")
    episodes, _ = _load(abstention_answer="Not mentioned in the conversation")
    adversarial = [e for e in episodes if e.metadata["adversarial"]]
    assert adversarial and all(e.target_answer == "Not mentioned in the conversation" for e in adversarial)


@pytest.mark.skipif(not REAL.is_file(), reason="real LoCoMo file not present")
def test_real_file_memory_r1_split_is_152_81_1307():
    answerable = {}
    for split in ("train", "validation", "test"):
        episodes, _ = _load(REAL, split=split, split_scheme="memory_r1")
        answerable[split] = sum(1 <= e.metadata["category"] <= 4 for e in episodes)
    assert answerable == {"train": 152, "validation": 81, "test": 1307}
    sample, _ = _load(REAL, split="test", split_scheme="memory_r1", test_sample=0.25)
    assert sum(1 <= e.metadata["category"] <= 4 for e in sample) == 339 and len(sample) == 435


def test_official_question_format_asks_as_locomo_does():
    plain, _ = _load()
    official, _ = _load(question_format="official")
    assert [e.episode_id for e in plain] == [e.episode_id for e in official]
    for p, o in zip(plain, official, strict=True):
        cat = p.metadata["category"]
        assert o.final_query == o.target.text
        if cat == 2:
            assert (
                o.final_query
                == p.final_query + " Use DATE of CONVERSATION to answer with an approximate date."
            )
        elif cat == 5:
            choices = o.metadata["choices"]
            assert sorted(choices.values()) == sorted(
                ["Not mentioned in the conversation", p.metadata["adversarial_answer"]]
            )
            assert o.final_query == (
                f"{p.final_query} Select the correct answer: (a) {choices['a']} (b) {choices['b']}."
            )
        else:
            assert o.final_query == p.final_query and "choices" not in o.metadata
    again, _ = _load(question_format="official")
    assert [e.final_query for e in again] == [e.final_query for e in official]  # the order is fixed
    with pytest.raises(ValueError, match="valid: plain, official"):
        _load(question_format="mcq")


@pytest.mark.skipif(not REAL.is_file(), reason="real LoCoMo file not present")
def test_real_file_official_choices_put_abstention_first_about_half_the_time():
    episodes, _ = _load(REAL, question_format="official")
    choices = [e.metadata["choices"] for e in episodes if "choices" in e.metadata]
    first = sum(c["a"] == "Not mentioned in the conversation" for c in choices)
    assert len(choices) >= 440 and 0.4 < first / len(choices) < 0.6


def test_observations_become_gold_adds_on_the_turn_that_completes_them():
    episodes, _ = _load(gold_memory="observations")
    ops = {t.turn_id: t.metadata for t in episodes[0].history}
    # Cited by D1:3 (Caroline's) and D1:4 (Melanie's reply): written when its last evidence arrives, and
    # about Caroline, whoever spoke last.
    assert ops["D1:3"] == {"memory_op": "NOOP"}
    assert ops["D1:4"]["memory_op"] == "ADD"
    assert ops["D1:4"]["memory_fact"].startswith("Caroline attended an LGBTQ support group")
    assert ops["D1:4"]["memory_person"] == "Caroline"
    assert ops["D2:8"]["memory_fact"].startswith("Caroline is researching adoption agencies")
    assert ops["D1:2"]["memory_person"] == "Melanie"
    assert sum(m["memory_op"] == "ADD" for m in ops.values()) == 5
    plain, _ = _load()
    assert all("memory_op" not in t.metadata for t in plain[0].history)


def test_observation_citing_an_unknown_turn_is_refused_by_name(tmp_path):
    raw = json.loads(LOCOMO_FIXTURE.read_text())
    raw[0]["observation"]["session_2_observation"]["Melanie"][0][1] = "D9:1"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(Exception, match=r"observation\.session_2_observation\.Melanie\[0\].*D9:1"):
        _load(path, gold_memory="observations")
    with pytest.raises(ValueError, match="valid: none, observations"):
        _load(gold_memory="facts")


@pytest.mark.skipif(not REAL.exists(), reason="real LoCoMo file not present")
def test_real_file_observations_cover_a_third_to_a_half_of_turns():
    episodes, _ = _load(REAL, split="train", split_scheme="memory_r1", gold_memory="observations")
    ops = Counter(t.metadata["memory_op"] for t in episodes[0].history)
    assert ops == {"ADD": 165, "NOOP": 254}
