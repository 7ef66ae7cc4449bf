"""StopChecker: stop strings found at the token that completes them, however long the output already is."""

from __future__ import annotations

from memrl.policy.sampling import StopChecker
from memrl.policy.tiny_arch import byte_tokenizer

TOK = byte_tokenizer()


def _feed(checker: StopChecker, text: str):
    """Append ``text``'s tokens one by one; the step (token count) and reason of the first stop, if any."""
    ids = TOK.encode(text, add_special_tokens=False)
    for i in range(1, len(ids) + 1):
        done, reason = checker.check(ids[:i])
        if done:
            return i, reason
    return None, None


def test_stop_string_deep_in_a_long_output_ends_it_at_the_completing_token():
    body = "abc <answer" * 40 + " déjà vu </python"  # near-misses, multi-byte characters, 450+ bytes
    text = body + "> then </answer> more"
    step, reason = _feed(StopChecker(TOK, ["</python>", "</answer>"], [], []), text)
    assert reason == "</python>"
    assert step == len(TOK.encode(body + ">", add_special_tokens=False))


def test_no_stop_string_means_no_stop_and_eos_or_stop_ids_still_stop():
    checker = StopChecker(TOK, ["</python>"], [7], [1])
    assert _feed(checker, "x" * 500 + "</pytho") == (None, None)
    assert checker.check([50, 60, 7]) == (True, 7)
    assert checker.check([50, 60, 1]) == (True, None)


def test_stop_completed_by_the_second_byte_of_a_character_is_found():
    # "é" is two byte tokens; the first decodes alone to U+FFFD, the second completes the stop string.
    step, reason = _feed(StopChecker(TOK, ["café"], [], []), "un café noir")
    assert reason == "café" and step == len("un café".encode())


def test_stop_ending_in_whitespace_is_found_without_the_prefilter():
    checker = StopChecker(TOK, ["Q: "], [], [])
    assert not checker._prefilter
    step, reason = _feed(checker, "xx Q: yy")
    assert reason == "Q: " and step == len("xx Q: ")
