"""``synthetic``: a generated multi-session memory task (no files needed; seeded; any size).

Each episode is a conversation between two speakers over ``num_sessions`` dated sessions. Short templated
history turns state attributes of a few persons (favourite colour, city, pet's name, job, age, number of
siblings, number of pets, savings) among chit-chat and other persons' attributes. The target turn asks one
question of one of three types (``metadata["question_type"]``):

* ``lookup``     – an attribute stated once ("What is Mia's job?")
* ``update``     – an attribute stated, then changed in a later session; the answer is the latest value
* ``arithmetic`` – a sum/difference over remembered numbers ("How old will Mia be in 7 years?");
  ``metadata["gold_python"]`` is a one-line program printing the answer (``print(31 + 7)``). With
  ``arithmetic_range=[lo, hi]`` every arithmetic question is over savings (after saving more, two persons'
  together, how many more one has than the other), and savings and the amounts added are drawn from
  ``[lo, hi]``: with 4-digit values a small model cannot do the sum in its head and needs the python tool.

``metadata["evidence_turn_ids"]`` lists the turns stating the facts the answer needs (for updates: the turn with
the latest value). Other persons' attributes change too (distractors), so the word "now" alone does not give
the answer away. Splits: ``train`` and ``test`` draw names and categorical values from disjoint pools, so the
test set is held out (numbers share one range: the task is to recall them, not to know them); ``all`` is
train followed by test. Episode ``i`` of a split depends only on ``(seed, split, i)``, never on
``num_episodes``, so growing the dataset keeps its prefix. Option ``small_talk``: ``synthetic`` (default, the
task's 18 chit-chat lines) or ``wide`` (those and the ~130 of :mod:`memrl.adapters.small_talk`), for training a
writer that leaves small talk alone; more turns per session with fewer distractors
(``turns_per_session``, ``distractor_fraction``) give it more such NOOP demonstrations. Sentences are short and fixed so a ~1M-parameter
byte-level model can learn to copy answers out of facts.

Example::

    from memrl.data.adapters import run_adapter
    episodes, _ = run_adapter("synthetic", None, split="train", options={"num_episodes": 100, "seed": 0})
"""

from __future__ import annotations

import datetime as dt
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass

from memrl.adapters.small_talk import SMALL_TALK
from memrl.adapters.synthetic_phrasing import PHRASINGS, varied_text
from memrl.data.adapters import ADAPTERS, SkipReport
from memrl.types import BatchInput, TurnRole, TurnSpec

QUESTION_TYPES = ("lookup", "update", "arithmetic")


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


_NAMES = _words(
    "Mia Omar Lena Ravi Sofia Noah Aiko Liam Nora Ivan Zara Hugo Emma Kofi Lucia Theo Amara Finn Yuki Jonas "
    "Priya Mateo Hana Leo Ines Sam Maya Oscar Leila Tariq Elsa Diego Nina Arjun Clara Felix Rosa Kenji Ada "
    "Marco Iris Pablo Greta Yusuf Alma Victor Esme Hamid June Bruno Lila Caleb Vera Omid Tess Rafael Uma "
    "Niko Wren Dario"
)
_COLOURS = _words(
    "red blue green yellow purple orange pink teal brown black white grey gold silver navy maroon olive "
    "coral violet amber"
)
_CITIES = _words(
    "Paris Lima Oslo Cairo Tokyo Rome Delhi Quito Seoul Dakar Lagos Perth Vienna Dublin Prague Madrid "
    "Boston Denver Austin Nairobi Lisbon Athens Berlin Zurich Havana Manila Hanoi Bogota Accra Sydney"
)
_PET_NAMES = _words(
    "Rex Bella Max Luna Coco Milo Daisy Rocky Pepper Ziggy Biscuit Fudge Mango Shadow Nugget Pickle "
    "Ginger Toby Willow Pixel Peanut Noodle Socks Maple Hazel Tofu Waffles Juniper Oreo Button"
)
# Consonant-initial only, so "{p} is a {v}." never needs "an".
_JOBS = _words(
    "teacher nurse baker pilot chef farmer dentist painter plumber lawyer writer doctor banker "
    "florist tailor barber potter driver singer sailor"
)

_CHITCHAT = (
    "Hi, how are you today?",
    "I am fine, thanks for asking.",
    "The weather is nice today.",
    "It rained all morning here.",
    "I had a long day at work.",
    "Did you watch the game last night?",
    "I made soup for dinner.",
    "I am reading a good book.",
    "We should meet for coffee soon.",
    "My train was late again.",
    "I went for a walk in the park.",
    "That sounds like fun.",
    "I need to buy new shoes.",
    "The market was busy today.",
    "I am tired but happy.",
    "Good to talk to you again.",
    "I saw {other} at the market.",
    "{other} says hello to you.",
)
# Option ``small_talk``: the pool the turns that state nothing are drawn from. ``wide`` adds the hand-written
# training pool of memrl.adapters.small_talk (~130 lines of real chat register) to the task's own 18 lines, so a
# writer learns NOOP for small talk rather than for these 18 sentences.
SMALL_TALK_POOLS = {"synthetic": _CHITCHAT, "wide": _CHITCHAT + SMALL_TALK}


@dataclass(frozen=True)
class _Attr:
    """One attribute: how it is stated, re-stated after a change, asked, and where its values come from."""

    name: str
    state: str
    update: str | None  # None = this attribute never changes (age)
    ask: str
    numeric: bool = False


_ATTRS = {
    a.name: a
    for a in (
        _Attr("colour", "{p}'s favourite colour is {v}.", "{p}'s favourite colour is now {v}.",
              "What is {p}'s favourite colour?"),
        _Attr("city", "{p} lives in {v}.", "{p} now lives in {v}.", "Which city does {p} live in?"),
        _Attr("pet_name", "{p}'s pet is called {v}.", "{p}'s pet is now called {v}.",
              "What is the name of {p}'s pet?"),
        _Attr("job", "{p} is a {v}.", "{p} is now a {v}.", "What is {p}'s job?"),
        _Attr("age", "{p} is {v} years old.", None, "How old is {p}?", numeric=True),
        _Attr("siblings", "{p} has {v} siblings.", "{p} now has {v} siblings.",
              "How many siblings does {p} have?", numeric=True),
        _Attr("pets", "{p} has {v} pets.", "{p} now has {v} pets.", "How many pets does {p} have?",
              numeric=True),
        _Attr("savings", "{p} has {v} dollars in savings.", "{p} now has {v} dollars in savings.",
              "How many dollars does {p} have in savings?", numeric=True),
    )
}  # fmt: skip
_DISTRACTOR_UPDATE_P = 0.3  # share of changeable distractor facts stated as old value, then "now" new value
# Varied phrasing, train split: share of first statements worded as a change from a value this conversation never
# stated ("I moved from Lima to Rome."). Their gold operation is ADD: nothing in memory is replaced. Without them
# every change-worded turn of the demonstrations is an UPDATE, and the writer learned the wording instead of
# looking at its memory: held-out first statements that sound like a change ("Ivan turned 34 this year.", "Noah
# saved 589 dollars so far.") were written as UPDATEs of any shown fact, even another person's.
_UNANCHORED_CHANGE_P = 0.25
# Varied phrasing, train split: share of changes worded as a plain statement ("I live in Rome." after "I live in
# Lima."). Their gold operation stays UPDATE: only the memory shows that the value changed. Without them, the
# wording alone told a change, and a writer could ADD a held-out change worded in a way it had not seen, beside
# the stale fact it was shown.
_UNMARKED_CHANGE_P = 0.25


def _statement_pattern(template: str) -> re.Pattern[str]:
    text = re.escape(template).replace(re.escape("{p}"), r"(?P<p>[A-Z][A-Za-z]*)")
    return re.compile("^" + text.replace(re.escape("{v}"), r"(?P<v>[A-Za-z0-9]+)") + "$")


_STATEMENTS = [
    (_statement_pattern(t), a.name, t == a.update) for a in _ATTRS.values() for t in (a.state, a.update) if t
]


def parse_statement(text: str) -> tuple[str, str, str, bool] | None:
    """``(person, attribute, value, is_update)`` of a templated attribute turn, ``None`` for anything else
    (chit-chat). Works on renamed episodes too (any capitalised name, any one-word value)."""
    for pattern, attr, is_update in _STATEMENTS:
        m = pattern.match(text.strip())
        if m:
            return m["p"], attr, m["v"], is_update
    return None


def ask(attr: str, person: str) -> str:
    """The question this task asks about ``person``'s ``attr``."""
    return _ATTRS[attr].ask.format(p=person)


# Counts start at 2 so every templated sentence stays grammatical ("has 1 pets").
_NUMERIC_RANGES = {"age": (18, 79), "siblings": (2, 8), "pets": (2, 7), "savings": (100, 999)}


def _split_pool(values: Sequence[str], split: str) -> list[str]:
    # Even positions → train, odd → test: disjoint, and stable when the lists grow at the end.
    return list(values[0 if split == "train" else 1 :: 2])


def _pools(split: str) -> dict[str, list[str]]:
    return {
        "names": _split_pool(_NAMES, split),
        "colour": _split_pool(_COLOURS, split),
        "city": _split_pool(_CITIES, split),
        "pet_name": _split_pool(_PET_NAMES, split),
        "job": _split_pool(_JOBS, split),
    }


def _draw(
    rng: random.Random, pools: dict[str, list[str]], attr: str, avoid: str | None = None,
    ranges: dict[str, tuple[int, int]] = _NUMERIC_RANGES,
) -> str:  # fmt: skip
    while True:  # rejection sampling: pools have >= 10 values, so this ends after ~1 draw
        value = str(rng.randint(*ranges[attr])) if attr in ranges else rng.choice(pools[attr])
        if value != avoid:
            return value


@dataclass(frozen=True)
class _Fact:
    person: str
    attr: str
    value: str


@dataclass
class _Plan:
    """Statements placed into (session, slot) positions before chit-chat fills the rest."""

    slots: dict[tuple[int, int], str | _Fact]  # chit-chat text, or a fact rendered once the order is known
    num_sessions: int
    turns_per_session: int

    def free(self, sessions: range | None = None) -> list[tuple[int, int]]:
        sessions = sessions if sessions is not None else range(self.num_sessions)
        return [(s, t) for s in sessions for t in range(self.turns_per_session) if (s, t) not in self.slots]

    def place(self, rng: random.Random, text: str | _Fact, sessions: range | None = None) -> tuple[int, int]:
        free = self.free(sessions)
        if not free:
            raise ValueError("synthetic: not enough turn slots; raise turns_per_session or num_sessions")
        pos = rng.choice(free)
        self.slots[pos] = text
        return pos


def _turn_id(pos: tuple[int, int]) -> str:
    return f"D{pos[0] + 1}:{pos[1] + 1}"


class _EpisodeBuilder:
    """Builds one episode; keeps the per-episode state (persons, values, plan) in one place."""

    def __init__(
        self, rng: random.Random, split: str, num_sessions: int, turns_per_session: int, n_persons: int,
        speakers_are_persons: bool = False, arithmetic_range: tuple[int, int] | None = None,
        small_talk: Sequence[str] = _CHITCHAT,
    ):  # fmt: skip
        self.rng = rng
        self.small_talk = small_talk
        self.pools = _pools(split)
        self.arithmetic_range = arithmetic_range
        self.ranges = dict(_NUMERIC_RANGES, savings=arithmetic_range) if arithmetic_range else _NUMERIC_RANGES
        names = rng.sample(self.pools["names"], n_persons + 2)
        self.persons, self.speakers = names[:n_persons], names[n_persons:]
        if speakers_are_persons:  # varied phrasing: speakers talk about themselves in the first person
            self.speakers = self.persons[:2]
        self.values = {p: {a: self.draw(a) for a in _ATTRS} for p in self.persons}
        self.plan = _Plan({}, num_sessions, turns_per_session)
        self.stated: set[tuple[str, str]] = set()

    def draw(self, attr: str, avoid: str | None = None, rng: random.Random | None = None) -> str:
        return _draw(rng or self.rng, self.pools, attr, avoid, self.ranges)

    def state(self, person: str, attr: str, sessions: range | None = None) -> str:
        self.stated.add((person, attr))
        fact = _Fact(person, attr, self.values[person][attr])
        return _turn_id(self.plan.place(self.rng, fact, sessions))

    def state_with_update(self, person: str, attr: str) -> str:
        """State an old value in some session, then the current value in a strictly later one."""
        n = self.plan.num_sessions
        first = self.rng.randrange(0, n - 1)
        later = self.rng.randrange(first + 1, n)
        old = self.draw(attr, avoid=self.values[person][attr])
        self.plan.place(self.rng, _Fact(person, attr, old), range(first, first + 1))
        self.stated.add((person, attr))
        fact = _Fact(person, attr, self.values[person][attr])
        return _turn_id(self.plan.place(self.rng, fact, range(later, later + 1)))

    def question(self, qtype: str) -> tuple[str, str, list[str], str | None, list[str]]:
        """(question, answer, evidence turn ids, gold_python, attributes asked)."""
        return _QUESTIONS[qtype](self)

    def _changed(self, person: str, attr: str) -> bool:
        """State an old then the current value in two free slots of different sessions, if there are any."""
        free = self.plan.free()
        last = max(s for s, _ in free)
        early = [f for f in free if f[0] < last]
        if not early:
            return False
        first = self.rng.choice(early)
        second = self.rng.choice([f for f in free if f[0] > first[0]])
        old = self.draw(attr, avoid=self.values[person][attr])
        self.plan.slots[first] = _Fact(person, attr, old)
        self.plan.slots[second] = _Fact(person, attr, self.values[person][attr])
        self.stated.add((person, attr))
        return True

    def add_distractors(self, fraction: float) -> None:
        free = self.plan.free()
        n_facts = int(round(len(free) * fraction))
        unstated = [(p, a) for p in self.persons for a in _ATTRS if (p, a) not in self.stated]
        self.rng.shuffle(unstated)
        for person, attr in unstated[:n_facts]:
            if not self.plan.free():
                break
            # Other persons change too, so "now" alone never points at the answer.
            if (
                _ATTRS[attr].update
                and self.rng.random() < _DISTRACTOR_UPDATE_P
                and self._changed(person, attr)
            ):
                continue
            self.state(person, attr)
        others = [n for n in self.pools["names"] if n not in self.persons + self.speakers]
        for pos in self.plan.free():
            line = self.rng.choice(self.small_talk).format(other=self.rng.choice(others))
            self.plan.slots[pos] = line


def _q_lookup(b: _EpisodeBuilder):
    person, attr = b.rng.choice(b.persons), b.rng.choice(sorted(_ATTRS))
    tid = b.state(person, attr)
    return _ATTRS[attr].ask.format(p=person), b.values[person][attr], [tid], None, [attr]


def _q_update(b: _EpisodeBuilder):
    person = b.rng.choice(b.persons)
    attr = b.rng.choice(sorted(a for a, spec in _ATTRS.items() if spec.update))
    tid = b.state_with_update(person, attr)
    return _ATTRS[attr].ask.format(p=person), b.values[person][attr], [tid], None, [attr]


def _q_arithmetic(b: _EpisodeBuilder):
    if b.arithmetic_range is not None:
        return _q_large_arithmetic(b)
    kind = b.rng.choice(("age_in", "pets_together", "siblings_together", "savings_after"))
    p, q = b.rng.sample(b.persons, 2)
    v = b.values
    if kind == "age_in":
        k, attr = b.rng.randint(2, 20), "age"
        ids = [b.state(p, attr)]
        text, a, c = f"How old will {p} be in {k} years?", int(v[p][attr]), k
    elif kind == "savings_after":
        k, attr = b.rng.randint(10, 500), "savings"
        ids = [b.state(p, attr)]
        text, a, c = f"How many dollars will {p} have after saving {k} more?", int(v[p][attr]), k
    else:
        attr = "pets" if kind == "pets_together" else "siblings"
        ids = [b.state(p, attr), b.state(q, attr)]
        text = f"How many {attr} do {p} and {q} have together?"
        a, c = int(v[p][attr]), int(v[q][attr])
    return text, str(a + c), ids, f"print({a} + {c})", [attr]


def _q_large_arithmetic(b: _EpisodeBuilder):
    """A sum or difference of savings drawn from ``arithmetic_range`` (the amount saved too)."""
    kind = b.rng.choice(("savings_after", "savings_together", "savings_difference"))
    p, q = b.rng.sample(b.persons, 2)
    a, c = int(b.values[p]["savings"]), int(b.values[q]["savings"])
    if kind == "savings_after":
        c = int(b.draw("savings"))
        ids = [b.state(p, "savings")]
        text, op = f"How many dollars will {p} have after saving {c} more?", "+"
    elif kind == "savings_together":
        ids = [b.state(p, "savings"), b.state(q, "savings")]
        text, op = f"How many dollars do {p} and {q} have in savings together?", "+"
    else:
        if a < c:  # the program subtracts the smaller savings: p is the one with more
            (p, a), (q, c) = (q, c), (p, a)
        if a == c:
            b.values[p]["savings"] = str(a := a + 1)
        ids = [b.state(p, "savings"), b.state(q, "savings")]
        text, op = f"How many more dollars does {p} have in savings than {q}?", "-"
    answer = a + c if op == "+" else a - c
    return text, str(answer), ids, f"print({a} {op} {c})", ["savings"]


_QUESTIONS = {"lookup": _q_lookup, "update": _q_update, "arithmetic": _q_arithmetic}


def _session_dates(rng: random.Random, n: int) -> list[dt.datetime]:
    day = dt.datetime(2023, 1, 1) + dt.timedelta(days=rng.randrange(0, 365))
    out = []
    for _ in range(n):
        day = day + dt.timedelta(days=rng.randint(1, 30))
        out.append(day.replace(hour=rng.randint(8, 21), minute=rng.choice((0, 15, 30, 45))))
    return out


def _fmt(d: dt.datetime) -> str:
    return d.strftime("%Y-%m-%d %H:%M")


def _varied(
    b: _EpisodeBuilder, item: _Fact, prev: str | None, speaker: str, split: str, rng: random.Random
) -> str:
    said_old = prev
    if prev is None and split == "train" and _ATTRS[item.attr].update and rng.random() < _UNANCHORED_CHANGE_P:
        said_old = b.draw(item.attr, avoid=item.value, rng=rng)  # a change from a value never stated here
    elif prev is not None and prev != item.value and split == "train" and rng.random() < _UNMARKED_CHANGE_P:
        said_old = None  # a change worded as a first statement
    return varied_text(item.attr, item.person, item.value, said_old, speaker, split, rng)


def _render(
    b: _EpisodeBuilder, dates: list[dt.datetime], phrasing: str, split: str, rng: random.Random
) -> list[TurnSpec]:
    """The history turns in order; facts are worded now that their order (first statement or change) and their
    speaker are known, and each turn gets its gold memory operation (:mod:`memrl.memory.gold`)."""
    latest: dict[tuple[str, str], str] = {}
    turns = []
    for s in range(b.plan.num_sessions):
        for t in range(b.plan.turns_per_session):
            item, speaker = b.plan.slots[(s, t)], b.speakers[t % 2]
            meta: dict = {"memory_op": "NOOP"}
            if isinstance(item, _Fact):
                prev = latest.get((item.person, item.attr))
                latest[(item.person, item.attr)] = item.value
                spec = _ATTRS[item.attr]
                meta = {
                    "memory_op": "ADD" if prev is None else ("UPDATE" if prev != item.value else "NOOP"),
                    "memory_fact": spec.state.format(p=item.person, v=item.value),
                    "memory_person": item.person,
                    "memory_attr": item.attr,
                    "memory_value": item.value,
                }
                if prev is not None and prev != item.value:
                    meta["memory_stale"] = prev
                if phrasing == "varied":
                    text = _varied(b, item, prev, speaker, split, rng)
                else:
                    text = (spec.state if prev is None else spec.update).format(p=item.person, v=item.value)
            else:
                text = item
            turns.append(
                TurnSpec(
                    role=TurnRole.HISTORY, text=text, turn_id=_turn_id((s, t)), speaker=speaker,
                    timestamp=_fmt(dates[s] + dt.timedelta(minutes=t)), metadata=meta,
                )
            )  # fmt: skip
    return turns


def make_episode(
    seed: int, split: str, index: int, *, num_sessions: int = 3, turns_per_session: int = 6,
    n_persons: int = 3, distractor_fraction: float = 0.5, question_types: Sequence[str] = QUESTION_TYPES,
    phrasing: str = "fixed", arithmetic_range: tuple[int, int] | None = None, small_talk: str = "synthetic",
) -> BatchInput:  # fmt: skip
    """Episode ``index`` of ``split``; a pure function of its arguments."""
    if small_talk not in SMALL_TALK_POOLS:
        raise ValueError(
            f"synthetic adapter: small_talk must be one of {sorted(SMALL_TALK_POOLS)}, got {small_talk!r}"
        )
    rng = random.Random(f"memrl-synthetic:{seed}:{split}:{index}")
    qtype = question_types[index % len(question_types)]  # cycling keeps the type mix exact
    b = _EpisodeBuilder(
        rng,
        split,
        num_sessions,
        turns_per_session,
        n_persons,
        phrasing == "varied",
        arithmetic_range,
        SMALL_TALK_POOLS[small_talk],
    )
    question, answer, evidence, gold_python, attrs = b.question(qtype)
    b.add_distractors(distractor_fraction)
    dates = _session_dates(rng, num_sessions)
    # Wording draws from its own stream, so the fixed phrasing's episodes stay what they were.
    wording = random.Random(f"memrl-synthetic-wording:{seed}:{split}:{index}")
    turns = _render(b, dates, phrasing, split, wording)
    ask_time = _fmt(dates[-1] + dt.timedelta(days=rng.randint(1, 7)))
    turns.append(
        TurnSpec(role=TurnRole.TARGET, text=question, turn_id="Q", speaker="User", timestamp=ask_time)
    )
    episode_id = f"synthetic-{split}-{seed}-{index}"
    meta = {
        "question_type": qtype,
        "answer_kind": "number" if answer.lstrip("-").isdigit() else "word",
        "evidence_turn_ids": evidence,
        "attributes": attrs,
        "session_dates": [_fmt(d) for d in dates],
        "split": split,
        "seed": seed,
    }
    if gold_python is not None:
        meta["gold_python"] = gold_python
    return BatchInput(episode_id, episode_id, tuple(turns), question, answer, meta)


def _validate(num_episodes, num_sessions, turns_per_session, n_persons, distractor_fraction, question_types):
    problems = []
    if num_episodes < 0:
        problems.append(f"num_episodes must be >= 0, got {num_episodes}")
    if num_sessions < 1 or turns_per_session < 1:
        problems.append("num_sessions and turns_per_session must be >= 1")
    if not 2 <= n_persons <= 10:
        problems.append(
            f"n_persons must be in [2, 10] (arithmetic questions need two persons), got {n_persons}"
        )
    if not 0.0 <= distractor_fraction <= 1.0:
        problems.append(f"distractor_fraction must be in [0, 1], got {distractor_fraction}")
    unknown = [q for q in question_types if q not in QUESTION_TYPES]
    if unknown or not question_types:
        problems.append(
            f"question_types must be a non-empty subset of {QUESTION_TYPES}, got {question_types}"
        )
    if "update" in question_types and num_sessions < 2:
        problems.append("update questions need num_sessions >= 2 (the change happens in a later session)")
    if num_sessions * turns_per_session < 2:
        problems.append("need at least 2 history turns per episode (raise turns_per_session)")
    if problems:
        raise ValueError("synthetic adapter: " + "; ".join(problems))


def _parse_range(value: Sequence[int] | str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    parts = value.split("-") if isinstance(value, str) else list(value)
    try:
        lo, hi = (int(x) for x in parts)
    except (TypeError, ValueError):
        lo = hi = -1  # reported below with the value as given
    if not 2 <= lo < hi:
        raise ValueError(
            f"synthetic adapter: arithmetic_range must be [lo, hi] (or 'lo-hi') with 2 <= lo < hi, e.g. "
            f"[1000, 9999]; got {value!r}"
        )
    return lo, hi


@ADAPTERS.register("synthetic")
def synthetic(
    path: str | None, *, split: str, lenient: bool, report: SkipReport, num_episodes: int = 1000,
    seed: int = 0, num_sessions: int = 3, turns_per_session: int = 6, n_persons: int = 3,
    distractor_fraction: float = 0.5, question_types: Sequence[str] = QUESTION_TYPES,
    max_turn_chars: int | None = None, phrasing: str = "fixed",
    arithmetic_range: Sequence[int] | str | None = None, small_talk: str = "synthetic",
) -> list[BatchInput]:  # fmt: skip
    """``num_episodes`` generated episodes of ``split`` (``all`` = that many train then that many test).

    ``path`` must be ``None`` or ``"-"``; ``lenient``/``report``/``max_turn_chars`` exist for the common
    adapter signature (generated records are never malformed). ``arithmetic_range``: ``[lo, hi]`` (or
    ``"lo-hi"``) of the savings that arithmetic questions add and subtract (see the module docstring).
    """
    if path not in (None, "", "-"):
        raise ValueError(f"synthetic adapter generates its data; path must be empty or '-', got {path!r}")
    if isinstance(question_types, str):
        question_types = [q.strip() for q in question_types.split(",") if q.strip()]
    num_episodes, seed = int(num_episodes), int(seed)
    num_sessions, turns_per_session, n_persons = int(num_sessions), int(turns_per_session), int(n_persons)
    distractor_fraction = float(distractor_fraction)
    _validate(num_episodes, num_sessions, turns_per_session, n_persons, distractor_fraction, question_types)
    if phrasing not in PHRASINGS:
        raise ValueError(f"synthetic adapter: phrasing must be one of {PHRASINGS}, got {phrasing!r}")
    value_range = _parse_range(arithmetic_range)
    if split == "validation":
        raise ValueError("adapter 'synthetic' has splits train and test (and all), no validation split")
    splits = ("train", "test") if split == "all" else (split,)
    return [
        make_episode(
            seed, s, i, num_sessions=num_sessions, turns_per_session=turns_per_session, n_persons=n_persons,
            distractor_fraction=distractor_fraction, question_types=tuple(question_types), phrasing=phrasing,
            arithmetic_range=value_range, small_talk=small_talk,
        )
        for s in splits
        for i in range(num_episodes)
    ]  # fmt: skip
