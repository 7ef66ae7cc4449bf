"""Benchmark-specific scoring: LoCoMo per category, LongMemEval with abstention questions.

LoCoMo (snap-research/locomo ``task_eval/evaluation.py``) categories: 1 multi-hop (comma-separated sub-answers,
mean of best sub-answer F1), 2 temporal, 3 open-domain (only the part of the gold before ``;`` counts), 4
single-hop (stemmed token F1), 5 adversarial (no gold; correct = the answer abstains; asked as a two-way choice,
a letter answer counts as the option it names).
LongMemEval: questions whose id ends in ``_abs`` are unanswerable (correct = abstain); the rest are scored with a
string metric (token F1 by default; the official judge is an LLM, see ``llm_judge``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from memrl.rewards.base import REWARDS, PerItemReward, RewardConfigError, RewardContext, RewardFn, RewardInput
from memrl.rewards.base import check_options as _check
from memrl.rewards.text import exact_match, multi_answer_f1, normalize_answer, token_f1

LOCOMO_ABSTENTION = ("no information available", "not mentioned")
LONGMEMEVAL_ABSTENTION = (
    "no information available",
    "not mentioned",
    "not enough information",
    "unanswerable",
    "cannot be answered",
    "i don't know",
    "i do not know",
    "did not mention",
)

LOCOMO_CATEGORY_NAMES = {1: "multi_hop", 2: "temporal", 3: "open_domain", 4: "single_hop", 5: "adversarial"}


def abstains(answer: str, phrases: Sequence[str]) -> bool:
    low = answer.lower()
    return any(p in low for p in phrases)


def locomo_category(metadata: Mapping[str, Any]) -> int:
    """The LoCoMo category (1–5) from an episode's metadata; raises if missing (it is needed to score)."""
    raw = metadata.get("category")
    try:
        cat = int(raw)
    except (TypeError, ValueError):
        raise RewardConfigError(
            f"reward 'locomo': episode metadata needs an integer 'category' in 1..5, got {raw!r}"
            " (use the locomo adapter, or another reward)"
        ) from None
    if cat not in LOCOMO_CATEGORY_NAMES:
        raise RewardConfigError(f"reward 'locomo': category must be in 1..5, got {cat}")
    return cat


_CHOICE = re.compile(r"\(?([ab])\)")


def chosen_option(answer: str, choices: Mapping[str, str] | None) -> str:
    """The option a two-way answer picks (LoCoMo's ``question_format: official``): ``a``, ``(b)``, ``(a) text``
    read as that option's text, as the official ``get_cat_5_answer`` does; other answers pass through. Stricter
    than the official script in one case: an answer that repeats both options picks neither (""), so copying
    the choice line never counts as abstaining."""
    if not choices:
        return answer
    low = answer.strip().lower()
    if all(str(opt).lower() in low for opt in choices.values()):
        return ""
    if low in choices:
        return str(choices[low])
    letter = _CHOICE.match(low)
    return str(choices[letter.group(1)]) if letter and letter.group(1) in choices else answer


def locomo_score(x: RewardInput, phrases: Sequence[str] = LOCOMO_ABSTENTION, stem: bool = True) -> float:
    cat = locomo_category(x.metadata)
    if cat == 5 or x.metadata.get("adversarial"):
        return float(abstains(chosen_option(x.answer, x.metadata.get("choices")), phrases))
    if x.gold is None:
        raise RewardConfigError(
            f"reward 'locomo': category {cat} question without a gold answer: {x.question!r}"
        )
    if cat == 1:
        return multi_answer_f1(x.answer, x.gold, stem)
    gold = x.gold.split(";")[0].strip() if cat == 3 else x.gold
    return token_f1(x.answer, gold, stem)


@REWARDS.register("locomo")
def make_locomo(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    opts = _check("locomo", options, {"abstention_phrases": list(LOCOMO_ABSTENTION), "stem": True})
    phrases = tuple(p.lower() for p in opts["abstention_phrases"])
    return PerItemReward("locomo", lambda x: locomo_score(x, phrases, opts["stem"]))


def is_abstention_question(metadata: Mapping[str, Any]) -> bool:
    if metadata.get("abstention"):
        return True
    qid = str(metadata.get("question_id", ""))
    return qid.endswith("_abs")


_LME_METRICS: dict[str, Callable[[str, str], float]] = {
    "f1": token_f1,
    "em": exact_match,
    "contains": lambda a, g: float(bool(normalize_answer(g)) and normalize_answer(g) in normalize_answer(a)),
}


@REWARDS.register("longmemeval")
def make_longmemeval(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    opts = _check(
        "longmemeval", options, {"abstention_phrases": list(LONGMEMEVAL_ABSTENTION), "metric": "f1"}
    )
    if opts["metric"] not in _LME_METRICS:
        raise RewardConfigError(
            f"reward 'longmemeval': option metric={opts['metric']!r}; valid: {sorted(_LME_METRICS)}"
        )
    metric = _LME_METRICS[opts["metric"]]
    phrases = tuple(p.lower() for p in opts["abstention_phrases"])

    def score(x: RewardInput) -> float:
        if is_abstention_question(x.metadata) or x.gold is None:
            return float(abstains(x.answer, phrases))
        return metric(x.answer, x.gold)

    return PerItemReward("longmemeval", score)


@REWARDS.register("abstention")
def make_abstention(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    """1 when the answer abstains; for unanswerable questions in isolation (eval of refusal behaviour)."""
    opts = _check("abstention", options, {"abstention_phrases": list(LONGMEMEVAL_ABSTENTION)})
    phrases = tuple(p.lower() for p in opts["abstention_phrases"])
    return PerItemReward("abstention", lambda x: float(abstains(x.answer, phrases)))
