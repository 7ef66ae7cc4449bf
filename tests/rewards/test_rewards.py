"""Reward registry: LoCoMo normalisation/F1, per-category LoCoMo, LongMemEval abstention, format, composite."""

from __future__ import annotations

import pytest

from memrl.registry import RegistryError
from memrl.rewards import REWARDS, RewardConfigError, RewardInput, make_reward
from memrl.rewards.benchmarks import chosen_option
from memrl.rewards.format import format_problems
from memrl.rewards.text import char_similarity, multi_answer_f1, normalize_answer, token_f1


def _x(response: str, gold: str | None, **meta) -> RewardInput:
    return RewardInput.from_response(response, gold, "question?", meta)


def test_normalisation_and_f1_follow_locomo():
    assert normalize_answer("The  Cat, and a Dog!") == "cat dog"
    assert token_f1("running dogs", "the dog runs") == pytest.approx(1.0)  # Porter stems run/dog
    assert token_f1("running dogs", "the dog runs", stem=False) == 0.0
    assert token_f1("red car", "red bike") == pytest.approx(0.5)
    assert token_f1("", "x") == 0.0
    # multi-hop: mean over gold sub-answers of the best predicted sub-answer
    assert multi_answer_f1("paris, rome", "Rome, Paris, Berlin") == pytest.approx(2 / 3)


def test_exact_match_uses_extracted_answer_and_none_gold_scores_zero():
    em = make_reward("exact_match")
    scores = em([_x("<answer>Oslo.</answer>", "oslo"), _x("Oslo", "Bergen"), _x("<answer>x</answer>", None)])
    assert scores == [1.0, 0.0, 0.0]


def test_strict_exact_match_needs_the_answer_tag_and_lenient_match_reads_the_prose():
    responses = [
        _x("<answer>Lisbon</answer>", "Lisbon"),
        _x("Zara lives in Lisbon.", "Lisbon"),  # right content, no tag
        _x("<answer>Lisbon", "Lisbon"),  # tag never closed
        _x("<search>Lisbon</search> <result>Zara lives in Lisbon</result><answer>Porto</answer>", "Lisbon"),
        _x("Zara lives in Lisbonia.", "Lisbon"),  # not a whole-word match
    ]
    assert make_reward("exact_match")(responses) == [1.0, 0.0, 0.0, 0.0, 0.0]
    # the tool call and its result cannot answer for the model
    assert make_reward("lenient_match")(responses) == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert make_reward("answer_tag")(responses) == [1.0, 0.0, 0.0, 1.0, 0.0]
    assert make_reward("lenient_match")([_x("no idea", None)]) == [0.0]
    assert [r.tagged for r in responses] == [True, False, False, True, False]
    assert responses[1].answer == "Zara lives in Lisbon."  # content scores read the prose


def test_char_similarity_credits_partial_copies():
    assert char_similarity("Tofu", "tofu.") == 1.0  # normalised like exact match
    assert char_similarity("Hefu", "Tofu") == pytest.approx(0.5)  # "fu" matched: 2 * 2 / 8
    assert char_similarity("nse", "nurse") == pytest.approx(2 * 3 / 8)
    assert char_similarity("", "nurse") == 0.0
    assert char_similarity("Hefu", "Tofu") > char_similarity("Ajna", "Tofu") == 0.0
    r = make_reward("composite", {"parts": {"exact_match": 1.0, "char_similarity": 0.5}})
    assert r([_x("<answer>Tofu</answer>", "Tofu"), _x("<answer>Hefu</answer>", "Tofu"), _x("x", None)]) == [
        1.5,
        0.25,
        0.0,
    ]


def test_locomo_per_category():
    r = make_reward("locomo")
    cases = [
        (_x("<answer>paris, rome</answer>", "Rome, Paris, Berlin", category=1), 2 / 3),
        (_x("<answer>7 May 2023</answer>", "7 May 2023", category=2), 1.0),
        (_x("<answer>hiking</answer>", "hiking; she likes outdoor things", category=3), 1.0),
        (_x("<answer>No information available.</answer>", None, category=5), 1.0),
        (_x("<answer>she went to Paris</answer>", None, category=5), 0.0),
    ]
    got = r([c for c, _ in cases])
    assert got == pytest.approx([s for _, s in cases])
    with pytest.raises(RewardConfigError, match="category"):
        r([_x("a", "a")])


def test_locomo_two_way_choice_reads_letters_as_options():
    r = make_reward("locomo")
    choices = {"a": "bowling", "b": "Not mentioned in the conversation"}
    answers = [
        "<answer>(b)</answer>",
        "b",
        "<answer>(a)</answer>",
        "<answer>b) not mentioned</answer>",
        "<answer>Not mentioned in the conversation</answer>",
        "<answer>bowling</answer>",
        # repeating the whole choice line picks neither
        "<answer>(a) bowling (b) Not mentioned in the conversation</answer>",
    ]
    got = r([_x(a, None, category=5, choices=choices) for a in answers])
    assert got == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert chosen_option("(a)", None) == "(a)"


def test_longmemeval_abstention_and_metric_option():
    r = make_reward("longmemeval", {"metric": "em"})
    got = r(
        [
            _x("<answer>I don't know, it was not mentioned</answer>", "n/a", question_id="q1_abs"),
            _x("<answer>Tokyo</answer>", "n/a", question_id="q2_abs"),
            _x("<answer>Tokyo</answer>", "tokyo", question_id="q3"),
        ]
    )
    assert got == [1.0, 0.0, 1.0]
    with pytest.raises(RewardConfigError, match="valid"):
        make_reward("longmemeval", {"metric": "bleu"})


@pytest.mark.parametrize(
    ("text", "n_problems"),
    [
        ("<python>print(1)</python> <result>1</result><answer>1</answer>", 0),
        (
            "<search>ann city</search> <result>Oslo</result><python>x</python> <result>y</result><answer>a</answer>",
            0,
        ),
        ("<answer>1</answer>", 0),
        ("<python>print(1)<answer>1</answer>", 4),  # nested open, wrong close, python unclosed, no answer
        ("<python>x</python><answer>1</answer>", 1),  # no result after the call
        ("<answer>1</answer> trailing", 1),
        ("<answer>1</answer><answer>2</answer>", 2),
        ("no tags at all", 1),
        ("</result><answer>1</answer>", 1),
    ],
)
def test_format_problems(text, n_problems):
    assert len(format_problems(text)) == n_problems, format_problems(text)


def test_format_reward_and_composite():
    fmt = make_reward("format", {"penalty": 0.25})
    assert fmt([_x("<answer>1</answer>", None), _x("<python>x</python><answer>1</answer>", None)]) == [
        1.0,
        0.75,
    ]
    comp = make_reward("composite", {"parts": {"exact_match": 1.0, "format": 0.5}})
    # strict EM needs the tag: the untagged "Oslo" earns only the format part (0.5 * (1 - 0.5))
    assert comp([_x("<answer>Oslo</answer>", "oslo"), _x("Oslo", "oslo")]) == [1.5, 0.25]


def test_unknown_names_and_options_are_reported():
    with pytest.raises(RegistryError, match="valid choices: .*exact_match"):
        REWARDS.get("bleu")
    with pytest.raises(RewardConfigError, match="unknown option"):
        make_reward("token_f1", {"stemm": False})
    with pytest.raises(RewardConfigError, match="PolicyClient"):
        make_reward("llm_judge")


def test_tool_call_rewards_a_call_that_ran_on_questions_with_a_program():
    reward = make_reward("tool_call", {})
    program = {"gold_python": "print(1250 + 3400)"}
    ran = "<python>print(1250 + 3400)</python> <result>4650</result><answer>9</answer>"
    failed = "<python>print(x)</python> <result>Traceback (most recent call last):\nNameError: name 'x' is not defined</result>"
    cases = [
        (_x(ran, "4650", **program), 1.0),  # a call that ran scores, right answer or not
        (_x(ran.replace("4650", "4651"), "4650", **program), 1.0),
        (_x(ran, "4650"), 0.0),  # a lookup (no gold program) is not taught to call
        (_x(failed + "<answer>1</answer>", "4650", **program), 0.0),
        (
            _x(
                "<python>pass</python> <result>(no output; print() what you want to see)</result>",
                "1",
                **program,
            ),
            0.0,
        ),
        (_x("<python>print(1)</python>", "1", **program), 0.0),  # never ran: no result
        (_x("<python>   </python> <result>tool call format is wrong: empty</result>", "1", **program), 0.0),
        (_x("<answer>4650</answer>", "4650", **program), 0.0),
        # A failed call, rolled back or left in, then one that ran: the call that ran counts.
        (_x(failed + " " + ran, "4650", **program), 1.0),
    ]
    assert reward([x for x, _ in cases]) == [want for _, want in cases]
    assert make_reward("tool_call", {"questions": "all"})([_x(ran, "4650")]) == [1.0]
    assert make_reward("tool_call", {"tool": "search"})([_x(ran, "4650", **program)]) == [0.0]
    with pytest.raises(RewardConfigError, match="questions must be 'program' or 'all'"):
        make_reward("tool_call", {"questions": "some"})
