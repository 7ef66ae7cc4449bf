"""PromptBuilder: template rendering, chat-template ids, budget cuts by score, typed error past the budget."""

from __future__ import annotations

import re

import pytest
from transformers import ByT5Tokenizer

from memrl.episode.config import EpisodeConfig
from memrl.episode.prompt import PromptBuilder, PromptTooLongError, as_prompt_fact
from memrl.templates import PLAIN_CHAT_FORMAT

CHAT_TEMPLATE = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"


def _facts(n: int, scores=None):
    return [
        {
            "id": 100 + i,
            "text": f"Ann mentioned detail number {i}",
            "timestamp": f"2023-05-{i + 1:02d}",
            "speaker": "Ann",
            "source_ids": [f"D1:{i}"],
            "score": (scores[i] if scores else float(i)),
        }
        for i in range(n)
    ]


def _builder(budget: int = 1536, template: bool = False) -> PromptBuilder:
    tok = ByT5Tokenizer()
    if template:
        tok.chat_template = CHAT_TEMPLATE
    return PromptBuilder(EpisodeConfig(prompt_token_budget=budget), tok)


def test_renders_facts_in_given_order_with_dates():
    built = _builder().build("Where does Ann live?", _facts(3), "Ann likes Oslo.", ["python"])
    lines = built.text.splitlines()
    fact_lines = [line for line in lines if line.startswith("- [")]
    # Source ids stay in StepMeta, not in the prompt: a small model copies "(D1:0)"-style ids into its answers.
    assert fact_lines == [f"- [2023-05-0{i + 1}] Ann mentioned detail number {i}" for i in range(3)]
    assert "Recent: Ann likes Oslo." in lines
    assert "Tools: <python>...</python>" in lines
    assert built.included_fact_ids == (100, 101, 102) and built.cut_fact_ids == ()


def test_plain_format_without_chat_template_and_chat_template_when_present():
    plain = _builder().build("Q?", _facts(1))
    tok = ByT5Tokenizer()
    expected = PLAIN_CHAT_FORMAT.format(system=plain.text, user="Q?")
    assert list(plain.ids) == tok(expected, add_special_tokens=False)["input_ids"]
    templated = _builder(template=True).build("Q?", _facts(1))
    assert tok.decode(list(templated.ids)) == f"<system>{templated.text}\n<user>Q?\n<assistant>"


def test_budget_cuts_lowest_scores_first_and_minimally():
    scores = [0.9, 0.1, 0.5, 0.3, 0.8]
    full = _builder().build("Q?", _facts(5, scores))
    # Budget that fits exactly the full prompt minus the two lowest-scored fact lines.
    without_two = _builder().build("Q?", [f for f in _facts(5, scores) if f["id"] not in (101, 103)])
    built = _builder(budget=without_two.num_tokens).build("Q?", _facts(5, scores))
    assert built.cut_fact_ids == (101, 103)
    assert built.included_fact_ids == (100, 102, 104)  # order of the input (oldest first) preserved
    assert built.num_tokens <= without_two.num_tokens < full.num_tokens
    assert not built.summary_cut


def test_summary_dropped_after_the_facts_unless_it_cannot_fit_at_all_and_error_past_budget():
    # The bare prompt is 225 byte tokens, with the summary alone 384. Budget 400: the summary fits alone, so
    # facts are cut (lowest score first) to keep it.
    kept = _builder(budget=400).build("Q?", _facts(3), summary="x" * 150)
    assert not kept.summary_cut and kept.cut_fact_ids == (100, 101, 102) and kept.included_fact_ids == ()
    # Budget 300: no fact cut could make room for the summary, so it goes first and the facts that fit stay.
    built = _builder(budget=300).build("Q?", _facts(3), summary="x" * 150)
    assert built.summary_cut and built.included_fact_ids and len(built.ids) <= 300
    assert set(built.cut_fact_ids) | set(built.included_fact_ids) == {100, 101, 102}
    with pytest.raises(PromptTooLongError, match="prompt_token_budget"):
        _builder(budget=300).build("Q" * 200 + "?")


def test_fact_objects_and_bad_facts():
    class Obj:
        fact_id, text, timestamp, speaker, source_ids, score = 7, "Bo runs", None, "Bo", ("S1",), 0.5

    f = as_prompt_fact(Obj())
    assert (f.id, f.text, f.timestamp, f.source_ids) == (7, "Bo runs", None, ("S1",))
    assert "- [undated] Bo runs\n" in _builder().build("Q?", [Obj()]).text
    with pytest.raises(ValueError, match="'id'"):
        as_prompt_fact({"text": "no id"})


def test_facts_are_ordered_oldest_first():
    from dataclasses import dataclass

    from memrl.episode.prompt import order_facts

    @dataclass
    class Retrieved:  # the MemoryManager's RetrievedFact shape
        fact_id: int
        score: float

    facts = [Retrieved(7, 0.2), Retrieved(3, 0.9), Retrieved(5, 0.9), Retrieved(1, 0.1)]
    assert [f.fact_id for f in order_facts(facts)] == [1, 3, 5, 7]
    dicts = list(reversed(_facts(3, scores=[0.1, 0.8, 0.5])))
    assert [f["id"] for f in order_facts(dicts)] == [100, 101, 102]


def test_tool_example_shows_one_worked_python_call_in_the_response_format():
    from memrl.rewards.format import format_problems

    tok = ByT5Tokenizer()
    shown = PromptBuilder(EpisodeConfig(tool_example=True), tok).build("Q?", _facts(1), "", ["python"]).text
    lines = shown.splitlines()
    call = lines[lines.index("Tools: <python>...</python>") + 3]
    assert call == "<python>print(12 + 30)</python> <result>42</result><answer>42</answer>"
    assert format_problems(call) == []  # the example is a well-formed response
    # Its operands are said to come from memory, and no 4-digit literal is there to copy into a real call.
    said = lines[lines.index("Tools: <python>...</python>") + 1]
    assert "numbers in your memory" in said and "Ann has 12 dollars and Bo has 30 dollars" in said
    tool_lines = "\n".join(lines[lines.index("Tools: <python>...</python>") :])
    assert not re.search(r"\d{3}", tool_lines)
    # The answer line's example still comes last, nearest the question.
    assert lines[-1] == "<answer>teacher</answer>"
    for tools in (["search"], []):
        assert (
            "<python>print"
            not in PromptBuilder(EpisodeConfig(tool_example=True), tok).build("Q?", _facts(1), "", tools).text
        )
    assert "<python>print" not in _builder().build("Q?", _facts(1), "", ["python"]).text  # off by default
