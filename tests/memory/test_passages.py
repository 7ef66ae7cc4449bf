"""Passages from a ranking: fixed windows and budgeted passages (memrl.memory.passages)."""

from __future__ import annotations

from memrl.memory.passages import SPREAD, fixed_windows, named_speakers, question_speakers, select_passages
from memrl.memory.store import FactRecord

# Ten turns of one conversation; lengths in tokens are the number of words.
TURNS = [
    ("Ann", "I went hiking in the Alps last summer with my brother."),
    ("Bob", "Nice! Which trail?"),
    ("Ann", "The Haute Route, twelve days hut to hut."),
    ("Bob", "I prefer the beach honestly."),
    ("Ann", "My cat Miso knocked over a vase today."),
    ("Bob", "Cats do that, mine is called Pixel."),
    ("Ann", "Pixel is a cute name."),
    ("Bob", "I adopted Pixel from a shelter in March."),
    ("Ann", "Shelters are great, I volunteer at one on Sundays."),
    ("Bob", "That is kind of you."),
]
ORDERED = [
    FactRecord(fact_id=i + 1, namespace="ep", text=f"{sp}: {t}", speaker=sp, source_ids=(f"D1:{i}",), order=i)
    for i, (sp, t) in enumerate(TURNS)
]


def words(rec: FactRecord) -> int:
    return len(rec.text.split())


def ids(items) -> list[list[str]]:
    return [list(it.source_ids) for it in items]


def test_fixed_windows_carry_each_fact_once():
    items = fixed_windows([(3, 1.0), (2, 0.9), (8, 0.5)], ORDERED, k=3, n=1)
    # The second hit lies inside the first window: it adds only its uncarried neighbour.
    assert ids(items) == [["D1:1", "D1:2", "D1:3"], ["D1:0"], ["D1:6", "D1:7", "D1:8"]]
    assert [it.lead.fact_id for it in items] == [3, 2, 8]


def test_without_neighbours_the_context_is_the_first_k_hits():
    items = select_passages([(5, 1.0), (9, 0.8), (1, 0.7)], ORDERED, 2, 0, tokens=words)
    assert ids(items) == [["D1:4"], ["D1:8"]]


def test_passages_stay_within_the_fixed_window_budget_and_follow_converging_hits():
    # Hits: D1:0 alone, and D1:5 / D1:7 two turns apart, pointing at the stretch between them. Windows around the
    # first two hits spend the budget on D1:0-1 and D1:4-6; passages trade D1:4 for the third hit, D1:7, which
    # closes the stretch D1:5-7.
    ranked = [(1, 1.0), (6, 0.9), (8, 0.9)]
    windows = fixed_windows(ranked, ORDERED, 2, 1)
    assert ids(windows) == [["D1:0", "D1:1"], ["D1:4", "D1:5", "D1:6"]]
    budget = sum(words(f) for it in windows for f in it.facts)
    passages = select_passages(ranked, ORDERED, 2, 1, tokens=words)
    assert sum(words(f) for it in passages for f in it.facts) <= budget
    assert ids(passages) == [["D1:5", "D1:6", "D1:7"], ["D1:0", "D1:1"]]
    # A passage's score is its lead fact's value: its own score plus SPREAD ** d times the hits d turns away.
    assert passages[0].lead.fact_id == 6
    assert passages[0].score == 0.9 + 0.9 * SPREAD**2
    assert passages[0].text.split(" | ")[1] == "Ann: Pixel is a cute name."


def test_a_named_speaker_takes_the_budget_from_the_other_speaker():
    assert named_speakers("What did Bob adopt?", ORDERED) == {"Bob"}
    assert named_speakers("Where did Ann and Bob go?", ORDERED) == {"Ann", "Bob"}
    assert named_speakers("Where did I go?", ORDERED) == set()

    def ten(rec: FactRecord) -> int:
        return 10

    # One hit, Ann's D1:6: the budget is its window, three turns. Without a prior they are the hit and Bob's
    # adjacent turns; when the question names Ann, her own turns two away are worth as much as Bob's adjacent
    # ones (SPREAD**2 doubled), and the earliest of those ties, Ann's D1:4, takes Bob's D1:7's place.
    plain = select_passages([(7, 1.0)], ORDERED, 1, 1, tokens=ten)
    assert ids(plain) == [["D1:5", "D1:6", "D1:7"]]
    ann = select_passages([(7, 1.0)], ORDERED, 1, 1, tokens=ten, speakers={"Ann"})
    assert ids(ann) == [["D1:4", "D1:5", "D1:6"]]


def test_a_first_person_question_is_about_its_asker():
    assert question_speakers("What trail did I hike?", ORDERED, asked_by="Ann") == {"Ann"}
    assert question_speakers("Did Bob like my cat?", ORDERED, asked_by="Ann") == {"Ann", "Bob"}
    assert question_speakers("Can you suggest a trail I would like?", ORDERED, asked_by="Ann") == {"Ann"}
    # No "I": no asker prior.
    assert question_speakers("Where is the Haute Route?", ORDERED, asked_by="Ann") == set()
    # An asker who never speaks in this history (LoCoMo's "User" asking about Ann and Bob) adds nothing.
    assert question_speakers("What did I ask?", ORDERED, asked_by="User") == set()
    assert question_speakers("What did I ask?", ORDERED) == set()


def test_the_room_left_in_the_prompt_caps_the_passages():
    ranked = [(1, 1.0), (6, 0.9), (8, 0.9)]
    full = select_passages(ranked, ORDERED, 2, 1, tokens=words)
    capped = select_passages(ranked, ORDERED, 2, 1, tokens=words, max_tokens=12)
    assert sum(words(f) for it in full for f in it.facts) > 12
    assert 0 < sum(words(f) for it in capped for f in it.facts) <= 12
    # The best fact still comes first; what no longer fits is passed over, not cut in half.
    assert capped[0].lead.fact_id == full[0].lead.fact_id
