"""The invented-fact rule on writes seen on free-form chats, and its tally by turn kind."""

from __future__ import annotations

from memrl.memory.faithfulness import (
    FaithfulnessTally,
    content_words,
    render_faithfulness,
    turn_kind,
    unsupported_facts,
    unsupported_words,
    write_kind,
)
from memrl.types import TurnRole, TurnSpec


def said(text: str, speaker: str = "Priya", **meta) -> TurnSpec:
    return TurnSpec(TurnRole.HISTORY, text, "D1:1", speaker, metadata=meta)


MOVE = said("We finally moved out of Lyon - I live in Porto now!")


def test_a_fact_invented_from_small_talk_is_unsupported():
    # Writes the synthetic recipe's writer made on small-talk turns of held-out chats.
    assert unsupported_words("Diego is a musician.", [said("Makes sense.", "Lucia")]) == ("diego", "musician")
    assert unsupported_words(
        "Diego's favourite colour is blue.", [said("I burned the pasta again, classic me.", "Lucia")]
    ) == ("diego", "blue")
    assert unsupported_words("Zara is a taxi driver.", [said("Makes sense.", "Zara")]) == ("taxi", "driver")


def test_a_change_written_from_the_turn_that_states_it_is_supported():
    # The speaker's name, the relation word "lives" and the value "Porto" (in the turn) leave nothing unsupported.
    assert unsupported_words("Priya lives in Porto.", [MOVE]) == ()
    assert unsupported_words("Priya now lives in Porto", [MOVE]) == ()
    # ... but naming the other speaker, or a value the turn does not say, is not.
    assert unsupported_words("Lucia lives in Porto.", [MOVE]) == ("lucia",)
    assert unsupported_words("Priya lives in Lisbon.", [MOVE]) == ("lisbon",)


def test_numbers_word_endings_and_stems_are_matched():
    assert unsupported_words("Priya has 3 siblings.", [said("I have three brothers, all older.")]) == ()
    assert unsupported_words("Priya does fencing.", [said("Fencing club again tonight!")]) == ()
    assert unsupported_words("Priya enjoys fencing", [said("I fence on Tuesdays.")]) == ()
    assert unsupported_words("Priya has 4 pets.", [said("I have three cats.")]) == ("4",)


def test_the_speaker_is_read_from_every_turn_a_chunk_write_read():
    chunk = [said("Makes sense.", "Lucia"), said("I play the cello now.", "Priya")]
    assert unsupported_facts(["Priya plays the cello.", "Lucia plays the harp."], chunk) == (
        "Lucia plays the harp.",
    )


def test_content_words_drop_stopwords_relations_and_speakers():
    assert content_words("Priya's favourite colour is now teal.", ["Priya"]) == ["teal"]
    assert content_words("Mia works as an architect in Graz.") == ["mia", "architect", "graz"]


def test_turn_kind_from_the_dataset_or_from_the_gold_operation():
    assert turn_kind(said("hi", turn_kind="change")) == "change"
    assert turn_kind(said("Nice day.", memory_op="NOOP")) == "small_talk"
    assert turn_kind(said("I live in Rome.", memory_op="ADD", memory_person="Priya")) == "first"
    assert turn_kind(said("I live in Oslo.", memory_op="UPDATE", memory_person="Priya")) == "change"
    assert turn_kind(said("Still in Oslo.", memory_op="NOOP", memory_person="Priya")) == "repeat"
    assert turn_kind(said("hi")) == "unknown"
    assert write_kind(["small_talk", "change", "first"]) == "change"
    assert write_kind([]) == "unknown"


def test_tally_splits_the_invented_rate_by_turn_kind():
    tally = FaithfulnessTally()
    tally.add("small_talk", 1, ["Diego is a musician."], read="Lucia: Makes sense.")
    tally.add("small_talk", 0, [])
    tally.add("small_talk", 1, [])
    tally.add("change", 1, [])
    out = tally.summary()
    assert out["writes"] == 4
    assert out["invented_rate"] == 0.25
    small = out["by_turn_kind"]["small_talk"]
    assert (small["writes"], small["write_rate"], small["invented_rate"]) == (3, 0.6667, 0.3333)
    assert out["by_turn_kind"]["change"]["invented_rate"] == 0.0
    assert list(out["by_turn_kind"]) == ["change", "small_talk"]
    assert out["examples"] == [
        {"kind": "small_talk", "read": "Lucia: Makes sense.", "invented": ["Diego is a musician."]}
    ]
    assert render_faithfulness(out) == (
        "invented facts by turn kind: change 0.000 (write 1.000), small_talk 0.333 (write 0.667)"
    )
