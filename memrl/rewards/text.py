"""Answer normalisation and string-match rewards (LoCoMo's official normalisation and stemmed token F1)."""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter
from collections.abc import Mapping
from typing import Any

from nltk.stem import PorterStemmer

from memrl.formats import ANSWER_CLOSE, ANSWER_OPEN, strip_tool_segments
from memrl.rewards.base import REWARDS, PerItemReward, RewardContext, RewardFn, RewardInput, check_options

_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_PUNCT = set(string.punctuation)
_STEMMER = PorterStemmer()


def normalize_answer(text: str) -> str:
    """LoCoMo normalisation: drop commas, lower-case, strip punctuation and articles (a/an/the/and), squeeze
    whitespace."""
    text = text.replace(",", "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _tokens(text: str, stem: bool) -> list[str]:
    toks = normalize_answer(text).split()
    return [_STEMMER.stem(t) for t in toks] if stem else toks


def token_f1(prediction: str, gold: str, stem: bool = True) -> float:
    """Bag-of-tokens F1 between normalised (and Porter-stemmed, as LoCoMo) prediction and gold."""
    pred, ref = _tokens(prediction, stem), _tokens(gold, stem)
    common = Counter(pred) & Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def char_similarity(prediction: str, gold: str) -> float:
    """Character-level similarity of the normalised strings in [0, 1]: ``2 * matched / (len(pred) + len(gold))``
    over difflib's longest matching blocks (1 iff equal, 0 for an empty prediction against a non-empty gold).

    A dense training signal for answers that are copied out of the context: "Tofu" vs "Hefu" scores 0.5 where
    exact match and token F1 both give 0, so a policy that copies part of a word is ranked above one that copies
    none of it."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    return difflib.SequenceMatcher(None, pred, ref, autojunk=False).ratio()  # two empty strings: 1.0


def multi_answer_f1(prediction: str, gold: str, stem: bool = True) -> float:
    """LoCoMo multi-hop: gold and prediction are comma-separated sub-answers; mean over gold sub-answers of the
    best F1 against any predicted sub-answer."""
    preds = [p.strip() for p in prediction.split(",") if p.strip()] or [""]
    golds = [g.strip() for g in gold.split(",") if g.strip()]
    if not golds:
        return 0.0
    return sum(max(token_f1(p, g, stem) for p in preds) for g in golds) / len(golds)


def contains_words(text: str, gold: str) -> bool:
    """Whether the normalised ``gold`` is a whole-word span of the normalised ``text`` (an empty gold never is)."""
    gold = normalize_answer(gold)
    return bool(gold) and f" {gold} " in f" {normalize_answer(text)} "


def _gold_or_zero(fn):
    """String rewards score 0 when there is no gold answer (use an abstention-aware reward for those)."""

    def score(x: RewardInput) -> float:
        return 0.0 if x.gold is None else fn(x)

    return score


@REWARDS.register("exact_match")
def make_exact_match(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    """Strict: the response must put its answer in ``<answer>…</answer>`` (as a trained agent must), and the
    tag's content must equal the gold answer after normalisation."""
    check_options("exact_match", options, {})
    return PerItemReward("exact_match", _gold_or_zero(lambda x: x.tagged and exact_match(x.answer, x.gold)))


@REWARDS.register("lenient_match")
def make_lenient_match(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    """Content without format: 1 when the normalised gold answer appears as a whole-word span of the normalised
    response, tool calls and results removed (so a tool result cannot answer for the model). Credits "Zara lives
    in Lisbon." for gold "Lisbon" where strict exact match gives 0; a response listing many candidates also
    scores, which is why it is reported beside strict EM and never used alone."""
    check_options("lenient_match", options, {})

    def score(x: RewardInput) -> float:
        prose = strip_tool_segments(x.response).replace(ANSWER_OPEN, " ").replace(ANSWER_CLOSE, " ")
        return float(contains_words(prose, x.gold))

    return PerItemReward("lenient_match", _gold_or_zero(score))


@REWARDS.register("answer_tag")
def make_answer_tag(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    """1 when the response holds a complete ``<answer>…</answer>`` (the share of format-following answers)."""
    check_options("answer_tag", options, {})
    return PerItemReward("answer_tag", lambda x: float(x.tagged))


@REWARDS.register("token_f1")
def make_token_f1(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    opts = check_options("token_f1", options, {"stem": True})
    return PerItemReward("token_f1", _gold_or_zero(lambda x: token_f1(x.answer, x.gold, opts["stem"])))


@REWARDS.register("char_similarity")
def make_char_similarity(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    check_options("char_similarity", options, {})
    return PerItemReward("char_similarity", _gold_or_zero(lambda x: char_similarity(x.answer, x.gold)))


@REWARDS.register("contains")
def make_contains(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    """1 when the normalised gold appears as a whole-word span of the normalised answer."""
    check_options("contains", options, {})

    return PerItemReward("contains", _gold_or_zero(lambda x: float(contains_words(x.answer, x.gold))))
