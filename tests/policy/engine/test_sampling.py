"""Token selection: counter-based seeded sampling (exact distribution, nucleus, batch-invariant) and the
StopChecker (stop strings found at the token that completes them, however long the output already is)."""

from __future__ import annotations

import pytest
import torch

from memrl.policy.base import SamplingParams
from memrl.policy.engine.sampling import StopChecker, choose_tokens, counter_uniform, sample_inverse_cdf
from memrl.testing import byte_tokenizer

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


def _splitmix64(seed: int, step: int) -> float:
    """Reference splitmix64 in Python integers (explicit mod 2**64)."""
    m = (1 << 64) - 1
    z = (seed + (step + 1) * 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    z ^= z >> 31
    return ((z >> 11) + 1) / float(1 << 53)


def test_counter_uniform_is_splitmix64_and_uniform():
    seeds = [0, 1, 12345, (1 << 62) + 7, (1 << 63) - 1]
    steps = [0, 1, 2, 191, 10**6]
    got = counter_uniform(torch.tensor(seeds), torch.tensor(steps)).tolist()
    assert got == [_splitmix64(a, b) for a, b in zip(seeds, steps, strict=True)]
    u = counter_uniform(torch.full((40000,), 99), torch.arange(40000))
    assert float(u.min()) > 0.0 and float(u.max()) <= 1.0
    counts = torch.histc(u.float(), bins=10, min=0.0, max=1.0)
    assert float(counts.min()) > 3700 and float(counts.max()) < 4300  # 4000 expected per decile


def test_inverse_cdf_sampling_follows_the_distribution_and_the_nucleus():
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05])
    n = 20000
    u = counter_uniform(torch.full((n,), 7), torch.arange(n))
    full = sample_inverse_cdf(probs.expand(n, -1), torch.ones(n), u)
    freq = torch.bincount(full, minlength=5).float() / n
    assert freq[1] == 0.0  # zero mass: never chosen
    assert torch.allclose(freq, probs, atol=0.015)
    nucleus = sample_inverse_cdf(probs.expand(n, -1), torch.full((n,), 0.75), u)
    freq = torch.bincount(nucleus, minlength=5).float() / n
    assert set(nucleus.tolist()) == {0, 2}  # 0.5 + 0.3 reaches 0.75; the tail is cut
    assert freq[0] == pytest.approx(0.5 / 0.8, abs=0.015)
    assert set(sample_inverse_cdf(probs.expand(50, -1), torch.full((50,), 1e-6), u[:50]).tolist()) == {0}


def test_a_rows_samples_depend_on_its_seed_and_step_not_on_its_batch():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = [SamplingParams(temperature=1.0, top_logprobs=2)] * 5 + [SamplingParams(temperature=0.0)]
    seeds, steps = [11, 12, 13, 11, 11, 5], [0, 0, 0, 1, 0, 0]
    batch = [c.token for c in choose_tokens(logits, params, seeds, steps)]
    alone = [
        choose_tokens(logits[i : i + 1], params[i : i + 1], seeds[i : i + 1], steps[i : i + 1])[0].token
        for i in range(6)
    ]
    assert batch == alone
    assert batch[5] == int(logits[5].argmax())  # greedy row
    row = logits[:1].expand(200, -1)
    many = choose_tokens(row, params[:1] * 200, list(range(200)), [0] * 200)
    again = choose_tokens(row, params[:1] * 200, list(range(200)), [0] * 200)
    assert [c.token for c in many] == [c.token for c in again]  # reproducible
    assert len({c.token for c in many}) > 10  # and a different stream per seed


def test_only_tokens_that_can_hold_a_stop_strings_end_are_decoded_in_context():
    from memrl.policy.engine.sampling import _can_end_in

    stops = ("</answer>", "</python>")
    assert _can_end_in(stops, ">") and _can_end_in(stops, "er>") and _can_end_in(stops, "x</answer> and")
    assert not _can_end_in(stops, "<extra_id_7>")  # a '>' that cannot close either tag
    assert not _can_end_in(stops, "abc") and not _can_end_in(stops, "")


class _PieceTokenizer:
    """Multi-character tokens (as BPE vocabularies have), counting in-context decodes."""

    pieces = {0: "a ", 1: "</ans", 2: "wer>", 3: "<x_1>", 4: "b"}

    def __init__(self):
        self.window_decodes = 0

    def decode(self, ids, skip_special_tokens=False):
        if len(ids) > 1:
            self.window_decodes += 1
        return "".join(self.pieces[i] for i in ids)


def test_multi_character_tokens_complete_stops_and_near_misses_skip_the_decode():
    tok = _PieceTokenizer()
    checker = StopChecker(tok, ["</answer>"], [], [])
    ids = [0, 3, 4, 3, 0, 1]
    assert all(checker.check(ids[: i + 1]) == (False, None) for i in range(len(ids)))
    assert tok.window_decodes == 0  # "<x_1>" holds a '>' but cannot end "</answer>"
    assert checker.check([*ids, 2]) == (True, "</answer>")
