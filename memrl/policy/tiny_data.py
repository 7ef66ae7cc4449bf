"""SFT data for the embedded tiny model: synthetic-task episodes → (prompt ids, response ids, loss mask).

Prompts are built exactly as the episode pipeline builds them (:class:`memrl.episode.prompt.PromptBuilder`:
system = ``prompts/target_turn.j2`` with facts oldest first, summary and tools; messages ``[system, user]``;
chat template with generation prompt). Facts are rule-extractor style (``"{speaker}: {text}"``, one per turn):
the gold evidence turns plus distractors ranked as a lexical retriever would rank them for the question (so
the old value of an updated attribute is usually there too), plus a few random turns.

Responses follow :mod:`memrl.formats`: ``<answer>X</answer>`` + eos; arithmetic questions
``<python>{gold_python}</python> <result>{value}</result><answer>X</answer>`` + eos, where the
`` <result>…</result>`` part is tool output (loss mask 0).
"""

from __future__ import annotations

import dataclasses
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from memrl.formats import format_answer, format_result, format_tool_call
from memrl.types import BatchInput, TurnSpec

_WORD = re.compile(r"[A-Za-z0-9']+")
_STOPWORDS = frozenset(
    [
        "what",
        "is",
        "the",
        "a",
        "an",
        "of",
        "does",
        "do",
        "how",
        "many",
        "which",
        "in",
        "s",
        "to",
        "be",
        "will",
        "have",
        "has",
        "did",
    ]
)


@dataclass(frozen=True)
class SFTExample:
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]  # 1 = model token (trained), 0 = tool output


@dataclass(frozen=True)
class FactOptions:
    """How many distractor facts join the gold ones, and how often a short-term summary is present."""

    min_distractors: int = 2
    max_distractors: int = 5
    lexical_share: float = 0.6  # share of distractors picked by word overlap with the question
    summary_p: float = 0.3
    summary_turns: int = 2
    randomize_p: float = 0.0  # share of training episodes passed through randomize_names


_CONSONANTS = "bcdfghjklmnprstvz"
_VOWELS = "aeiou"
_QUESTION_WORDS = frozenset(["What", "Which", "How"])


def pseudo_word(rng: random.Random, capital: bool) -> str:
    """A pronounceable random word (2-3 syllables) no dataset pool contains."""
    word = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(rng.randint(2, 3)))
    return word.capitalize() if capital else word


def random_word(rng: random.Random, capital: bool) -> str:
    """3-8 uniformly random letters: unlike a pseudo-word, no prior over word shapes predicts it."""
    word = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 8)))
    return word.capitalize() if capital else word


WORD_MAKERS = {"pseudo": pseudo_word, "random": random_word}


def randomize_names(ep: BatchInput, rng: random.Random, word=pseudo_word) -> BatchInput:
    """Consistently replace the asked-about person(s) and a non-numeric answer with fresh ``word(rng, capital)``.

    The synthetic train and test splits draw names and values from disjoint pools; without this, a small model
    memorises the train pool's values instead of learning to copy the answer out of its facts. With pronounceable
    pseudo-words it learns to *generate* a plausible word instead (held-out word answers stayed at 0 % while
    digit answers, uniform and so only predictable by copying, reached ~50 %); ``random_word`` removes that
    shortcut."""
    subs = {w: word(rng, True) for w in re.findall(r"\b[A-Z][a-z]+\b", ep.final_query)}
    subs = {w: v for w, v in subs.items() if w not in _QUESTION_WORDS}
    answer = ep.target_answer or ""
    if answer and not answer.lstrip("-").isdigit():
        subs[answer] = word(rng, answer[:1].isupper())
    if not subs:
        return ep
    pattern = re.compile(r"\b(" + "|".join(re.escape(w) for w in subs) + r")\b")

    def sub(text: str) -> str:
        return pattern.sub(lambda m: subs[m.group(1)], text)

    turns = tuple(dataclasses.replace(t, text=sub(t.text)) for t in ep.turns)
    return dataclasses.replace(
        ep,
        turns=turns,
        final_query=sub(ep.final_query),
        target_answer=sub(answer) if ep.target_answer else None,
    )


def _terms(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)} - _STOPWORDS


def _fact(turn: TurnSpec, score: float) -> dict:
    return {
        "id": int(turn.turn_id.replace("D", "").replace(":", "")),
        "text": f"{turn.speaker}: {turn.text}" if turn.speaker else turn.text,
        "timestamp": turn.timestamp,
        "speaker": turn.speaker,
        "source_ids": [turn.turn_id],
        "score": score,
    }


def choose_facts(
    ep: BatchInput, rng: random.Random, opts: FactOptions, *, with_gold: bool = True
) -> list[dict]:
    """Gold evidence (unless ``with_gold=False``) + distractors, as retrieval dicts sorted oldest first."""
    history = list(ep.history)
    gold_ids = set(ep.metadata.get("evidence_turn_ids", ()))
    others = [t for t in history if t.turn_id not in gold_ids]
    q = _terms(ep.final_query)
    ranked = sorted(others, key=lambda t: (-len(q & _terms(t.text)), rng.random()))
    k = rng.randint(opts.min_distractors, opts.max_distractors)
    n_lex = min(len(ranked), round(k * opts.lexical_share))
    picked = ranked[:n_lex]
    rest = [t for t in others if t not in picked]
    picked += rng.sample(rest, min(len(rest), k - n_lex))
    if with_gold:
        picked += [t for t in history if t.turn_id in gold_ids]
    order = {t.turn_id: i for i, t in enumerate(history)}
    picked.sort(key=lambda t: order[t.turn_id])
    return [_fact(t, 1.0 if t.turn_id in gold_ids else 0.5) for t in picked]


def summary_for(ep: BatchInput, rng: random.Random, opts: FactOptions) -> str:
    """An extractive-style short-term summary of the last turns (present in a share of the examples)."""
    if rng.random() >= opts.summary_p:
        return ""
    return " ".join(f"{t.speaker}: {t.text}" for t in ep.history[-opts.summary_turns :])


def response_segments(ep: BatchInput) -> list[tuple[str, int]]:
    """``(text, mask)`` segments of the gold response (without eos)."""
    answer = ep.target_answer or ""
    program = ep.metadata.get("gold_python")
    segments = []
    if program:
        segments += [(format_tool_call("python", program), 1), (format_result(answer), 0)]
    segments.append((format_answer(answer), 1))
    return segments


def encode_text(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def follow_up_questions(
    facts: Sequence[dict], asked: str, rng: random.Random, k: int
) -> list[tuple[str, list[tuple[str, int]]]]:
    """Up to ``k`` more ``(question, response segments)`` about other attributes stated in ``facts``.

    The answer is the latest value among the facts shown (facts are oldest first), which is what answering from
    memory means. Each follow-up is one more supervised recall per forward pass: the expensive part of an
    example is its ~450-token prompt, and one answer per prompt left the model too few recall events to learn
    copying in a CPU-sized budget."""
    from memrl_adapters.synthetic import ask, parse_statement

    latest: dict[tuple[str, str], str] = {}
    for f in facts:
        parsed = parse_statement(f["text"].split(": ", 1)[-1])
        if parsed is not None:
            person, attr, value, _ = parsed
            latest[(person, attr)] = value
    pairs = [pa for pa in latest if ask(pa[1], pa[0]) != asked]
    rng.shuffle(pairs)
    return [(ask(a, p), [(format_answer(latest[(p, a)]), 1)]) for p, a in pairs[:k]]


def _append(tok, ids: list[int], mask: list[int], segments: Sequence[tuple[str, int]]) -> None:
    for text, m in segments:
        seg = encode_text(tok, text)
        ids += seg
        mask += [m] * len(seg)


def build_example(
    ep: BatchInput,
    builder,
    rng: random.Random,
    opts: FactOptions,
    tools: Sequence[str],
    follow_ups: int = 0,
    word=pseudo_word,
) -> SFTExample:
    """One SFT example; ``builder`` is a :class:`~memrl.episode.prompt.PromptBuilder` over the tokenizer.

    The first exchange is exactly what the pipeline prompts; ``follow_ups`` more user questions about the
    same memory (chat-template turns, loss mask 0 on the question) may follow it."""
    tok = builder.tokenizer
    if rng.random() < opts.randomize_p:
        ep = randomize_names(ep, rng, word)
    facts = choose_facts(ep, rng, opts)
    built = builder.build(ep.final_query, facts, summary_for(ep, rng, opts), tools)
    ids: list[int] = []
    mask: list[int] = []
    eos = int(tok.eos_token_id)
    _append(tok, ids, mask, response_segments(ep))
    ids.append(eos)
    mask.append(1)
    for question, segments in follow_up_questions(facts, ep.final_query, rng, follow_ups):
        # The chat template's separator after an assistant turn, then the next user turn (not trained).
        _append(tok, ids, mask, [(f"\n<|user|>\n{question}\n<|assistant|>\n", 0), *segments])
        ids.append(eos)
        mask.append(1)
    return SFTExample(tuple(built.ids), tuple(ids), tuple(mask))


def single_fact_example(ep: BatchInput, tok, rng: random.Random, word=random_word) -> SFTExample:
    """A short recall example (stage 1 of the tiny build): a memory of ONE fact — an evidence turn of the
    episode, renamed with ``word`` — then the question about it and its value. ~130 bytes instead of the
    pipeline's ~450, so many more recall events per CPU-second; the pipeline format comes in stage 2."""
    ep = randomize_names(ep, rng, word)
    facts = choose_facts(ep, rng, FactOptions(min_distractors=0, max_distractors=0, lexical_share=0.0))
    fact = facts[-1]
    [(question, segments)] = follow_up_questions([fact], "", rng, 1)
    prompt = encode_text(tok, f"<|system|>\nMemory:\n- {fact['text']}\n")
    ids: list[int] = []
    mask: list[int] = []
    _append(tok, ids, mask, [(f"<|user|>\n{question}\n<|assistant|>\n", 0), *segments])
    ids.append(int(tok.eos_token_id))
    mask.append(1)
    return SFTExample(tuple(prompt), tuple(ids), tuple(mask))


def letter_token_ids(tok) -> list[int]:
    """Ids of the tokenizer's pure-letter pieces (what names, pets and cities are spelt with)."""
    specials = set(tok.all_special_ids)
    ids = []
    for i in range(len(tok)):
        text = tok.decode([i])
        if i not in specials and text.isalpha() and text.isascii():
            ids.append(i)
    return ids


def repeat_drill_example(
    letters: Sequence[int], tok, rng: random.Random, words: tuple[int, int] = (3, 8)
) -> SFTExample:
    """A line of random letter-token words, then the same line again (loss on the repeat only).

    The purest induction drill: after the first repeated token, every next token is "what followed this token
    in the context", the skill that continues a word answer once its first token is chosen (the shipped model
    wrote "Pelqffu" for "Pixel": right first letter, no continuation). On its own a 3-layer model breaks out of
    the unigram plateau after ~1.5 k steps of these (batch 16), much sooner than inside the pipeline data."""
    space, newline = encode_text(tok, " "), encode_text(tok, "\n")
    line: list[int] = []
    for _ in range(rng.randint(*words)):
        line += [*rng.choices(letters, k=rng.randint(1, 5)), *space]
    line += newline
    return SFTExample(tuple(line), tuple(line), (1,) * len(line))


def copy_drill_example(
    letters: Sequence[int], tok, rng: random.Random, pairs: tuple[int, int] = (4, 10), queries: int = 3
) -> SFTExample:
    """Associative recall over random strings of letter tokens: ``key: value`` lines, then ``queries`` keys whose
    values the model writes (loss on the value and its newline only).

    The synthetic task's word answers are several tokens the model has never seen together; copying them needs
    two skills: pick the value after the right key (first token) and continue it (induction: what followed the
    current token in context). Here every value token is a copy target, ~40 per example against ~3 answer tokens
    in a pipeline example, and nothing but the context predicts them."""
    colon, newline = encode_text(tok, ": "), encode_text(tok, "\n")
    table: dict[tuple[int, ...], tuple[int, ...]] = {}
    while len(table) < rng.randint(*pairs):
        key = tuple(rng.choices(letters, k=rng.randint(1, 2)))
        table.setdefault(key, tuple(rng.choices(letters, k=rng.randint(2, 6))))
    prompt: list[int] = []
    for key, value in table.items():
        prompt += [*key, *colon, *value, *newline]
    ids: list[int] = []
    mask: list[int] = []
    for key in rng.sample(list(table), min(queries, len(table))):
        ids += [*key, *colon]
        mask += [0] * (len(key) + len(colon))
        ids += [*table[key], *newline]
        mask += [1] * (len(table[key]) + len(newline))
    return SFTExample(tuple(prompt), tuple(ids), tuple(mask))
