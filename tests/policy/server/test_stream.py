"""Streamed text deltas: whole characters only, stop strings held back until they fire, joined = final text."""

from __future__ import annotations

from transformers import ByT5Tokenizer

from memrl.policy.server.stream import TextStream, events_of
from memrl.types import FinishReason, GenerationOutput

TOK = ByT5Tokenizer()


def ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def out(token_ids, finish=FinishReason.LENGTH, stop=None) -> GenerationOutput:
    return GenerationOutput(tuple(token_ids), (-1.0,) * len(token_ids), finish, stop_reason=stop)


def stream_bytes(text: str, stops=(), include_stop=False, **final) -> list[str]:
    stream = TextStream(TOK, list(stops), include_stop)
    deltas = [stream.push([t]) for t in ids(text)]
    return [*deltas, stream.finish(out(ids(text), **final))]


def test_a_character_split_over_tokens_is_sent_once_whole():
    deltas = stream_bytes("né!")  # é is two bytes: the first alone shows nothing
    assert deltas == ["n", "", "é", "!", ""]


def test_a_stop_string_is_held_back_then_cut():
    deltas = stream_bytes("Oslo.\nQ:", stops=["\nQ:"], finish=FinishReason.STOP, stop="\nQ:")
    assert "".join(deltas) == "Oslo."
    assert deltas[:6] == ["O", "s", "l", "o", ".", ""]  # "\n" could start the stop: it waits, then is cut


def test_a_tail_that_never_became_the_stop_is_sent_at_the_end():
    deltas = stream_bytes("Oslo\nQ", stops=["\nQ:"])  # max_tokens ended it one byte short of the stop
    assert "".join(deltas) == "Oslo\nQ" and deltas[-1] == "\nQ"


def test_with_include_stop_the_stop_streams_like_any_text():
    deltas = stream_bytes("a\nQ:", stops=["\nQ:"], include_stop=True, finish=FinishReason.STOP, stop="\nQ:")
    assert deltas == ["a", "\n", "Q", ":", ""]


def test_finished_outputs_become_one_event_per_token_and_a_final_one():
    outputs = [[out(ids("ab")), out([])]]
    events = list(events_of(outputs, n=2))
    assert [(e.index, e.token_ids, e.final is not None) for e in events] == [
        (0, (ids("a")[0],), False),
        (0, (ids("b")[0],), True),
        (1, (), True),
    ]
