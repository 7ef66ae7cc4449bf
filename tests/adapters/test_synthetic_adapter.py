"""The synthetic memory task: determinism, held-out test split, latest-value updates, checkable arithmetic."""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter

import pytest

from memrl.adapters import synthetic as syn
from memrl.data.adapters import run_adapter
from memrl.types import TurnRole


def _gen(split="train", **options):
    options.setdefault("num_episodes", 60)
    episodes, report = run_adapter("synthetic", None, split=split, options=options)
    assert report.skipped == 0
    return episodes


# An independent reader of the templated facts: the last statement about (person, attribute) wins.
_PATTERNS = {
    "colour": r"^(\w+)'s favourite colour is (?:now )?(\w+)\.$",
    "city": r"^(\w+) (?:now )?lives in (\w+)\.$",
    "pet_name": r"^(\w+)'s pet is (?:now )?called (\w+)\.$",
    "job": r"^(\w+) is (?:now )?a (\w+)\.$",
    "age": r"^(\w+) is (\d+) years old\.$",
    "siblings": r"^(\w+) (?:now )?has (\d+) siblings\.$",
    "pets": r"^(\w+) (?:now )?has (\d+) pets\.$",
    "savings": r"^(\w+) (?:now )?has (\d+) dollars in savings\.$",
}


def _facts(episode) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """(person, attr) → [(turn_id, value), ...] in history order."""
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for turn in episode.history:
        for attr, pattern in _PATTERNS.items():
            m = re.match(pattern, turn.text)
            if m:
                out.setdefault((m.group(1), attr), []).append((turn.turn_id, m.group(2)))
    return out


def test_same_seed_same_episodes_and_prefix_stable():
    a = _gen(num_episodes=30, seed=7)
    b = _gen(num_episodes=30, seed=7)
    assert a == b
    longer = _gen(num_episodes=45, seed=7)
    assert longer[:30] == a  # growing the dataset keeps its prefix
    other = _gen(num_episodes=30, seed=8)
    assert [e.turns for e in other] != [e.turns for e in a]


def test_train_and_test_are_disjoint_in_names_and_values():
    train, test = _gen("train", num_episodes=80), _gen("test", num_episodes=80)

    def vocab(episodes):
        names, values = set(), set()
        for ep in episodes:
            names |= {t.speaker for t in ep.history}
            for (person, attr), stated in _facts(ep).items():
                names.add(person)
                if attr in ("colour", "city", "pet_name", "job"):
                    values |= {v for _, v in stated}
        return names, values

    (n_train, v_train), (n_test, v_test) = vocab(train), vocab(test)
    assert n_train and n_test and v_train and v_test
    assert not n_train & n_test
    assert not v_train & v_test
    assert {e.episode_id for e in train}.isdisjoint(e.episode_id for e in test)
    both = _gen("all", num_episodes=80)
    assert both == train + test


def test_episode_shape_and_metadata():
    episodes = _gen(num_episodes=30, num_sessions=4, turns_per_session=5)
    assert Counter(e.metadata["question_type"] for e in episodes) == {
        "lookup": 10,
        "update": 10,
        "arithmetic": 10,
    }
    for ep in episodes:
        assert len(ep.history) == 20 and ep.target.role is TurnRole.TARGET
        assert ep.final_query == ep.target.text and ep.group_id == ep.episode_id
        assert all(t.timestamp for t in ep.turns)
        assert [t.timestamp for t in ep.turns] == sorted(t.timestamp for t in ep.turns)
        assert len(ep.metadata["session_dates"]) == 4
        ids = {t.turn_id for t in ep.history}
        assert set(ep.metadata["evidence_turn_ids"]) <= ids
        assert re.fullmatch(r"\d+|[A-Za-z]+", ep.target_answer)
        kind = "number" if ep.target_answer.isdigit() else "word"
        assert ep.metadata["answer_kind"] == kind
    assert {e.metadata["answer_kind"] for e in episodes} == {"number", "word"}


def test_lookup_and_update_answers_are_the_latest_stated_value():
    episodes = _gen(num_episodes=90)
    updates = 0
    for ep in episodes:
        qtype = ep.metadata["question_type"]
        if qtype == "arithmetic":
            continue
        facts = _facts(ep)
        (attr,) = ep.metadata["attributes"]
        asked = [p for (p, a) in facts if a == attr and p in ep.final_query]
        assert len(asked) == 1, ep.final_query
        stated = facts[(asked[0], attr)]
        last_turn, last_value = stated[-1]
        assert ep.target_answer == last_value
        assert ep.metadata["evidence_turn_ids"] == [last_turn]
        if qtype == "update":
            updates += 1
            assert len(stated) == 2 and stated[0][1] != last_value
            sessions = [int(tid[1:].split(":")[0]) for tid, _ in stated]
            assert sessions[0] < sessions[1]  # the change happens in a later session
        else:
            assert len(stated) == 1
    assert updates == 30


def test_arithmetic_gold_python_prints_the_answer():
    episodes = [e for e in _gen(num_episodes=45) if e.metadata["question_type"] == "arithmetic"]
    assert len(episodes) == 15
    # One subprocess for all snippets: each snippet is our own generated code, run as a plain program.
    program = "\n".join(e.metadata["gold_python"] for e in episodes)
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == [e.target_answer for e in episodes]
    for ep in episodes:
        # the numbers in the program are the ones stated in the evidence turns
        stated = {t.turn_id: t.text for t in ep.history}
        numbers = re.findall(r"\d+", ep.metadata["gold_python"])
        evidence_numbers = [re.findall(r"\d+", stated[tid])[0] for tid in ep.metadata["evidence_turn_ids"]]
        assert numbers[: len(evidence_numbers)] == evidence_numbers


def test_question_type_subset_and_sizes():
    eps = _gen(num_episodes=7, question_types="update,lookup", num_sessions=2, turns_per_session=3)
    assert {e.metadata["question_type"] for e in eps} == {"update", "lookup"}
    assert all(len(e.history) == 6 for e in eps)
    assert _gen(num_episodes=0) == []


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"num_sessions": 1}, "update questions need num_sessions >= 2"),
        ({"question_types": ["riddle"]}, "question_types must be"),
        ({"n_persons": 1}, "n_persons"),
        ({"distractor_fraction": 2.0}, "distractor_fraction"),
        ({"num_episodes": -1}, "num_episodes"),
    ],
)
def test_bad_options_are_rejected_with_the_reason(options, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        _gen(**options)


def test_path_is_refused():
    with pytest.raises(ValueError, match="generates its data"):
        run_adapter("synthetic", "/tmp/some.json")


def test_make_episode_is_pure():
    assert syn.make_episode(3, "test", 11) == syn.make_episode(3, "test", 11)
    assert syn.make_episode(3, "test", 11) != syn.make_episode(3, "train", 11)


def test_distractors_change_too_so_now_is_not_a_shortcut():
    episodes = _gen(num_episodes=60)
    non_update_with_changes = 0
    for ep in episodes:
        changed = {key: stated for key, stated in _facts(ep).items() if len(stated) > 1}
        for stated in changed.values():
            assert len(stated) == 2 and stated[0][1] != stated[1][1]
            sessions = [int(tid[1:].split(":")[0]) for tid, _ in stated]
            assert sessions[0] < sessions[1]
        if ep.metadata["question_type"] != "update" and changed:
            non_update_with_changes += 1
    assert non_update_with_changes >= 10


def test_parse_statement_reads_back_every_attribute_turn_and_nothing_else():
    episodes = _gen(num_episodes=30)
    seen = 0
    for ep in episodes:
        expected = _facts(ep)
        for turn in ep.history:
            parsed = syn.parse_statement(turn.text)
            stated = [(key, v) for key, vals in expected.items() for tid, v in vals if tid == turn.turn_id]
            if not stated:
                assert parsed is None, turn.text
                continue
            seen += 1
            (person, attr), value = stated[0]
            assert parsed is not None and parsed[:3] == (person, attr, value)
            assert parsed[3] == (" now " in turn.text)
    assert seen > 100
    # Renamed episodes (pseudo-word names and values) parse too, and ask() is the task's own question.
    assert syn.parse_statement("Bakilo's pet is now called Dumeza.") == ("Bakilo", "pet_name", "Dumeza", True)
    lookups = [ep for ep in episodes if ep.metadata["question_type"] == "lookup"]
    for ep in lookups:
        (tid,) = ep.metadata["evidence_turn_ids"]
        text = next(t.text for t in ep.history if t.turn_id == tid)
        person, attr, value, _ = syn.parse_statement(text)
        assert syn.ask(attr, person) == ep.final_query and value == ep.target_answer


def test_varied_phrasing_words_changes_many_ways_with_held_out_wordings():
    from memrl.adapters.synthetic import make_episode
    from memrl.adapters.synthetic_phrasing import _TRAIN_ONLY, _VARIED, _pool

    for attr, (first, changes) in _VARIED.items():
        for entries, more in zip((first, changes), _TRAIN_ONLY[attr], strict=True):
            if len(entries) > 1:  # test-split wordings are never train-split wordings
                assert not set(_pool(entries, "train") + more) & set(_pool(entries, "test"))
    # The train-only wordings reach train episodes and never test ones.
    train = " ".join(
        t.text for i in range(200) for t in make_episode(0, "train", i, phrasing="varied").history
    )
    test = " ".join(t.text for i in range(200) for t in make_episode(0, "test", i, phrasing="varied").history)
    for words in ("reside", "earn a living", "earns a living", "brothers and sisters", "put aside"):
        assert (words in train) and (words not in test), words
    eps = [make_episode(0, "test", i, phrasing="varied") for i in range(60)]
    turns = [t for ep in eps for t in ep.history]
    updates = [t for t in turns if t.metadata["memory_op"] == "UPDATE"]
    assert updates
    assert any(t.text.startswith(("I ", "My ")) for t in turns)  # first person
    assert any(t.metadata["memory_stale"] in t.text for t in updates)  # the old value named ...
    assert any(t.metadata["memory_stale"] not in t.text for t in updates)  # ... or not
    assert len({t.text.split(" ", 1)[1][:12] for t in updates}) > 5  # many wordings, not one keyword
    for t in turns:  # every turn has its gold operation; a fact turn says who and what
        assert t.metadata["memory_op"] in ("ADD", "UPDATE", "NOOP")
        if "memory_fact" in t.metadata:
            assert t.metadata["memory_value"] in t.text
    # The answer is still the latest value, and the fixed phrasing is what it always was.
    assert all(ep.target_answer for ep in eps)
    assert make_episode(0, "test", 1).turns == make_episode(0, "test", 1, phrasing="fixed").turns


def _worded_as(turn, kind: int) -> bool:
    """Does ``turn`` match one of its attribute's wordings of ``kind`` (0: first statement, 1: change), in any
    split and with any old value?"""
    import re

    from memrl.adapters.synthetic_phrasing import _TRAIN_ONLY, _VARIED

    m = turn.metadata
    for table in (_VARIED, _TRAIN_ONLY):
        for entry in table[m["memory_attr"]][kind]:
            for template in entry:
                text = template.format(p=m["memory_person"], v=m["memory_value"], old="\0")
                pattern = re.escape(text[0].upper() + text[1:]).replace("\0", "[A-Za-z0-9]+")
                if re.fullmatch(pattern, turn.text):
                    return True
    return False


def _worded_as_change(turn) -> bool:
    return _worded_as(turn, 1)


def _worded_as_first(turn) -> bool:
    return _worded_as(turn, 0)


def _turns_with_op(split: str, op: str) -> list:
    from memrl.adapters.synthetic import make_episode

    eps = [make_episode(0, split, i, phrasing="varied") for i in range(60)]
    return [t for ep in eps for t in ep.history if t.metadata["memory_op"] == op]


def test_train_first_statements_are_sometimes_worded_as_changes_and_stay_adds():
    train_adds, test_adds = _turns_with_op("train", "ADD"), _turns_with_op("test", "ADD")
    as_change = [t for t in train_adds if _worded_as_change(t)]
    # About a quarter of the changeable attributes' first statements (age never changes).
    assert 0.1 < len(as_change) / len(train_adds) < 0.35
    for t in as_change:  # nothing was stated before: the gold is a plain ADD of the current value
        assert "memory_stale" not in t.metadata and t.metadata["memory_value"] in t.metadata["memory_fact"]
    # The held-out split is unchanged: its first statements are worded as first statements.
    assert not any(_worded_as_change(t) for t in test_adds)


def test_train_changes_are_sometimes_worded_as_plain_statements_and_stay_updates():
    train_updates, test_updates = _turns_with_op("train", "UPDATE"), _turns_with_op("test", "UPDATE")
    plain = [t for t in train_updates if _worded_as_first(t)]
    # About a quarter of the changes: only the memory tells the writer they replace a value.
    assert 0.1 < len(plain) / len(train_updates) < 0.4
    for t in plain:  # the gold is still an UPDATE of the stale value, which the turn does not name
        assert t.metadata["memory_stale"] not in t.text.split()
        assert t.metadata["memory_value"] in t.metadata["memory_fact"]
    # The held-out split is unchanged: its changes are worded as changes.
    assert test_updates and not any(_worded_as_first(t) for t in test_updates)
    assert all(_worded_as_change(t) for t in test_updates)


def test_arithmetic_range_gives_large_savings_sums_and_differences_whose_programs_print_the_answer():
    mix = ["arithmetic", "lookup", "arithmetic", "update"]
    options = {
        "num_episodes": 400,
        "arithmetic_range": [1000, 9999],
        "question_types": mix,
        "phrasing": "varied",
    }
    test = _gen("test", **options)
    arithmetic = [e for e in test if e.metadata["question_type"] == "arithmetic"]
    assert len(arithmetic) == 200  # the held-out evaluation's arithmetic questions
    program = "\n".join(e.metadata["gold_python"] for e in arithmetic)
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.split() == [e.target_answer for e in arithmetic]
    ops = Counter()
    for ep in arithmetic:
        operands = [int(x) for x in re.findall(r"\d+", ep.metadata["gold_python"])]
        assert all(1000 <= x <= 10000 for x in operands), ep.metadata["gold_python"]
        assert int(ep.target_answer) > 0  # a difference subtracts the smaller savings
        stated = {t.turn_id: t.text for t in ep.history}
        evidence = [int(re.findall(r"\d+", stated[t])[0]) for t in ep.metadata["evidence_turn_ids"]]
        assert operands[: len(evidence)] == evidence  # the program's numbers are the remembered ones
        ops[ep.metadata["gold_python"].split()[1]] += 1
    assert ops["+"] > 0 and ops["-"] > 0
    # Held out: the test split's names never occur in the train split.
    train_names = {e.final_query.split()[4] for e in _gen("train", **options) if "will" in e.final_query}
    test_names = {e.final_query.split()[4] for e in arithmetic if "will" in e.final_query}
    assert test_names and not train_names & test_names


@pytest.mark.parametrize("value", [[5, 3], "10", [1, 9], "a-b"])
def test_a_bad_arithmetic_range_is_rejected_with_an_example(value):
    with pytest.raises(ValueError, match=r"arithmetic_range must be \[lo, hi\].*\[1000, 9999\]"):
        _gen(arithmetic_range=value)


def test_wide_small_talk_keeps_the_facts_and_draws_small_talk_from_the_training_pool():
    from memrl.adapters.small_talk import SMALL_TALK
    from memrl.adapters.synthetic import _CHITCHAT

    opts = {"num_episodes": 30, "phrasing": "varied"}
    plain = run_adapter("synthetic", None, split="train", options=opts)[0]
    wide = run_adapter("synthetic", None, split="train", options={**opts, "small_talk": "wide"})[0]
    facts = [[(t.turn_id, t.text, dict(t.metadata)) for t in ep.history if t.metadata.get("memory_person")]
             for ep in plain]  # fmt: skip
    assert facts == [
        [(t.turn_id, t.text, dict(t.metadata)) for t in ep.history if t.metadata.get("memory_person")]
        for ep in wide
    ]
    talk = [t.text for ep in wide for t in ep.history if not t.metadata.get("memory_person")]
    assert all(t.metadata["memory_op"] == "NOOP" for ep in wide for t in ep.history if t.text in talk)
    templates = {line.split("{")[0] for line in _CHITCHAT + SMALL_TALK}
    assert all(any(line.startswith(t) for t in templates) for line in talk)
    assert len(set(talk) & set(SMALL_TALK)) > 40  # most small talk now comes from the wide pool
    with pytest.raises(ValueError, match=r"small_talk must be one of \['synthetic', 'wide'\]"):
        run_adapter("synthetic", None, split="train", options={"num_episodes": 1, "small_talk": "chat"})
