"""Is a written fact supported by the turns its write read? The invented-fact rule, and its tally by turn kind.

A memory writer that turns "Makes sense." into "ADD Diego is a musician." corrupts a user's memory: an invented
ADD is noise, an invented UPDATE supersedes what was true. The rule here tells such writes apart from faithful
ones without a model, so ``memrl bench extract``, ``memrl eval``'s ``memory_writes`` block and the writer's
per-step reward term (``episode.memory_credit.unsupported_weight``) all count the same thing.

The rule: a written fact (the text of an ADD or an UPDATE) is **supported** when each of its *content words*
appears in the turns the write read. Content words are the fact's words aside from

* stopwords (articles, pronouns, auxiliaries, prepositions: :data:`STOPWORDS`),
* relation words, which say what kind of fact it is rather than what it states ("lives", "job", "favourite",
  "colour", "pet", "called", "siblings", "now": :data:`RELATION_WORDS`),
* the names of the speakers of the turns read: a first-person turn ("I live in Porto now!") supports a fact
  about its speaker ("Priya lives in Porto.") without naming her.

What remains are the names and values a fact states. Words are compared lower-cased, with number words read as
digits ("three" = "3"), after stripping a plural or verb ending (``-s``, ``-es``, ``-ed``, ``-ing``, ``-er``) and a final ``-e``,
and a stem of 5+ letters that begins the other word's stem also matches ("fence" / "fencing").

So "ADD Diego is a musician." read from "Makes sense." is invented ("diego", "musician" are not in the turn),
and "UPDATE 0 Priya lives in Porto." read from Priya's "We finally moved out of Lyon - I live in Porto now!" is
supported ("priya" is the speaker, "lives" a relation word, "porto" is in the turn).

Known misses, all in the lenient direction but the first:

* a paraphrase of a value is counted as invented ("Priya has a dog." from "my puppy"; "Priya is a doctor." from
  "I'm a physician"): the rule asks for the words, not the meaning;
* a word taken from the facts the writer was shown, not from the turn, is invented: an UPDATE that rewrites
  "Priya lives in Lyon with Milo" as "Priya lives in Porto with Milo" from "I live in Porto now" counts "milo";
* a fact that puts the turn's own words together wrongly is supported ("Priya lives in Lyon." from "We moved out
  of Lyon"): the words are there, the claim is not. Likewise a relation word is never checked ("Priya has 34
  siblings." from "I am 34");
* a prefix stem lets a related word pass ("Diego is a musician." from "I like music" when Diego speaks);
* a fact that restates a small-talk turn ("Priya is tired." from "I'm so tired today") is supported: it is true to
  the turn, only not worth keeping. The tally's ``write_rate`` counts such writes; the invented rate does not.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.types import TurnSpec

_WORD = re.compile(r"[a-z0-9]+")


def _wordset(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS = _wordset(
    """
    a an the and or but nor so yet of in on at to for from by with without into onto about as than then
    i me my mine we us our ours you your yours he him his she her hers they them their theirs it its
    this that these those there here who whom whose which what when where why how
    is are was were be been being am do does did done doing have has had having will would shall should can
    could may might must s t d ll ve re m not no yes very too also just still really quite all some any
    each every both either neither one's other others own same such again ever
    """
)
# Words that say what kind of fact it is (the attribute, the tense), not what it states.
RELATION_WORDS = _wordset(
    """
    now currently current today these days anymore longer since before after previously earlier formerly
    used usually lives live living lived moved move moving home based city town
    works work working worked job jobs career profession employed occupation role
    favourite favorite colour color
    pet pets called named name names
    age aged old years year
    siblings sibling brothers brother sisters sister
    dollars dollar savings saved saving money
    plays play playing played instrument
    does practices practise practice sport sports hobby hobbies enjoys likes loves into took takes
    learning learns learn studying studies study language
    person fact user speaker got gets get new
    drives drive driving drove car cars drink drinks author authors taking course courses class classes
    allergic allergy allergies supports support supporter fan fans club football
    """
)
_NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"
)
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(_NUMBERS.split(" "))}
_SUFFIXES = ("ing", "es", "ed", "er", "s")
_MIN_PREFIX = 5


def _stem(word: str) -> str:
    word = _NUMBER_WORDS.get(word, word)
    for suffix in _SUFFIXES:
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            break
    return word[:-1] if word.endswith("e") and len(word) >= 4 else word  # "fence" / "fencing"


def words(text: str) -> list[str]:
    """Lower-cased word tokens ("Diego's" → "diego", "s")."""
    return _WORD.findall(text.lower())


def content_words(fact: str, speakers: Iterable[str] = ()) -> list[str]:
    """The words of ``fact`` that have to appear in what was read (module doc), in order, without repeats."""
    skip = STOPWORDS | RELATION_WORDS | {w for s in speakers for w in words(s)}
    return list(dict.fromkeys(w for w in words(fact) if w not in skip))


def _matches(stem: str, read: set[str]) -> bool:
    if stem in read:
        return True
    return any(
        min(len(stem), len(r)) >= _MIN_PREFIX and (r.startswith(stem) or stem.startswith(r)) for r in read
    )


def unsupported_words(fact: str, turns: Sequence[TurnSpec]) -> tuple[str, ...]:
    """The content words of ``fact`` that none of ``turns`` (the turns a write read) contains; ``()`` when the
    fact is supported."""
    speakers = [t.speaker for t in turns if t.speaker]
    read = {_stem(w) for t in turns for w in words(t.text)}
    return tuple(w for w in content_words(fact, speakers) if not _matches(_stem(w), read))


def unsupported_facts(facts: Iterable[str], turns: Sequence[TurnSpec]) -> tuple[str, ...]:
    """The ``facts`` (texts of a write's ADDs and UPDATEs) the rule finds unsupported by ``turns``."""
    return tuple(f for f in facts if unsupported_words(f, turns))


# ---------------------------------------------------------------------------------------------------------
# Turn kinds

SMALL_TALK, FIRST, CHANGE, REPEAT, UNKNOWN = "small_talk", "first", "change", "repeat", "unknown"
TURN_KINDS = (SMALL_TALK, FIRST, CHANGE, REPEAT, UNKNOWN)
# A write that read turns of several kinds is counted under the one that asks the most of it.
_KIND_RANK = {CHANGE: 0, FIRST: 1, REPEAT: 2, SMALL_TALK: 3, UNKNOWN: 4}


def turn_kind(turn: TurnSpec) -> str:
    """``metadata["turn_kind"]`` where the dataset names it (the held-out chats), else read from the turn's gold
    operation: NOOP about nobody → small talk, ADD → first statement, UPDATE → change, NOOP about someone → a
    repeated value; ``unknown`` without gold (LoCoMo)."""
    kind = turn.metadata.get("turn_kind")
    if kind:
        return str(kind)
    op = turn.metadata.get("memory_op")
    if op == "ADD":
        return FIRST
    if op == "UPDATE":
        return CHANGE
    if op == "NOOP":
        return REPEAT if turn.metadata.get("memory_person") else SMALL_TALK
    return UNKNOWN


def write_kind(kinds: Sequence[str]) -> str:
    """One kind for a write that read turns of ``kinds`` (per-turn writes: the turn's own)."""
    return min(kinds, key=lambda k: _KIND_RANK.get(k, len(_KIND_RANK)), default=UNKNOWN)


@dataclass
class FaithfulnessTally:
    """Writes by the kind of turn they read: how many wrote a fact (``write_rate``), how many wrote one the rule
    finds unsupported (``invented_rate``, over all writes of that kind), and the unsupported share of facts."""

    writes: Counter = field(default_factory=Counter)
    writing: Counter = field(default_factory=Counter)
    inventing: Counter = field(default_factory=Counter)
    facts: Counter = field(default_factory=Counter)
    invented: Counter = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)
    max_examples: int = 8

    def add(self, kind: str, facts: int, unsupported: Sequence[str], read: str = "") -> None:
        """One write of ``kind`` that wrote ``facts`` facts, of which ``unsupported`` are invented; ``read``: the
        turns it read, kept with the first few invented facts as examples."""
        self.writes[kind] += 1
        self.writing[kind] += facts > 0
        self.inventing[kind] += bool(unsupported)
        self.facts[kind] += facts
        self.invented[kind] += len(unsupported)
        if unsupported and len(self.examples) < self.max_examples:
            self.examples.append({"kind": kind, "read": read[:200], "invented": list(unsupported)})

    def summary(self) -> dict[str, Any]:
        def rate(num: Counter, den: Counter, key: str | None = None) -> float | None:
            n, d = (num[key], den[key]) if key else (sum(num.values()), sum(den.values()))
            return round(n / d, 4) if d else None

        kinds = sorted(self.writes, key=lambda k: _KIND_RANK.get(k, len(_KIND_RANK)))
        return {
            "rule": "a written fact is invented when a content word (a name or value, aside from the speaker) "
            "is in none of the turns it read (memrl.memory.faithfulness)",
            "writes": sum(self.writes.values()),
            "invented_rate": rate(self.inventing, self.writes),
            "unsupported_fact_share": rate(self.invented, self.facts),
            "by_turn_kind": {
                k: {
                    "writes": self.writes[k],
                    "write_rate": rate(self.writing, self.writes, k),
                    "invented_rate": rate(self.inventing, self.writes, k),
                    "facts": self.facts[k],
                    "unsupported_fact_share": rate(self.invented, self.facts, k),
                }
                for k in kinds
            },
            "examples": self.examples,
        }


def render_faithfulness(summary: Mapping[str, Any]) -> str:
    """``invented facts: small_talk 0.210 (write 0.330), first 0.020 (write 0.950), …`` for tables."""
    parts = [
        f"{k} {v['invented_rate']:.3f} (write {v['write_rate']:.3f})"
        for k, v in summary["by_turn_kind"].items()
        if v["invented_rate"] is not None
    ]
    return "invented facts by turn kind: " + ", ".join(parts)
