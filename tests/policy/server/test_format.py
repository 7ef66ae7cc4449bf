"""OpenAI's per-token ``bytes``: whole characters from the text, parts of one from the vocabulary piece."""

from __future__ import annotations

from transformers import ByT5Tokenizer

from memrl.policy.server.format import token_bytes


class _Pieces:
    """A tokenizer stand-in whose vocabulary piece for every id is ``piece``."""

    def __init__(self, piece: str) -> None:
        self.piece = piece

    def convert_ids_to_tokens(self, tid: int) -> str:
        return self.piece


def test_whole_characters_are_their_utf8_bytes():
    assert token_bytes(_Pieces("Ã©"), 0, "é") == [0xC3, 0xA9]
    assert token_bytes(_Pieces("Ġthe"), 0, " the") == [0x20, 0x74, 0x68, 0x65]


def test_part_of_a_character_comes_from_the_piece():
    # "日" is E6 97 A5: byte-level BPE splits it over pieces that decode to U+FFFD on their own.
    assert token_bytes(_Pieces("Ġæ"), 0, " \ufffd") == [0x20, 0xE6]
    assert token_bytes(_Pieces("Ĺ"), 0, "\ufffd") == [0x97]
    assert token_bytes(_Pieces("<0xE6>"), 0, "\ufffd") == [0xE6]  # SentencePiece byte fallback
    byt5 = ByT5Tokenizer()  # a lone lead byte decodes to nothing
    assert token_bytes(byt5, 0xC3 + 3, byt5.decode([0xC3 + 3])) == [0xC3]


def test_no_bytes_when_the_piece_does_not_say():
    assert token_bytes(_Pieces("\x85"), 0, "") is None
