"""``chats``: held-out free-form two-person chats in LoCoMo's file format, for checking a memory writer on
conversations it never saw. **Never train on them or choose settings by them**: split ``test`` is the held-out
chats; splits ``train`` and ``validation`` are chats of the same shape made from a training pool that shares no
name, value, wording or small-talk line with them (:mod:`memrl.adapters.chats_train_text`), and a training split
refuses a held-out chat read from a file.

Each chat is two speakers over ``num_sessions`` dated sessions. Every turn is small talk from a wide hand-written
pool (:data:`memrl.adapters.chats_text.SMALL_TALK`: "Traffic was terrible today.", "Makes sense.") except the
speakers' own personal facts: where they live, their job, sport, instrument, the language they learn, their pet's
name, stated in the first person in many wordings, and for ``changes`` of them changed in a later session ("We
finally moved out of Lyon - I live in Porto now!"). Names, values and small talk share nothing with the synthetic
task's vocabulary (:mod:`memrl.adapters.chats_text`), so a writer that writes what it learned there instead of
what it read shows as invented facts (:mod:`memrl.memory.faithfulness`).

Questions (``metadata["question_type"]``, which ``memrl eval`` reports separately):

* ``now``: the current value of a fact that changed ("Which city does Amelie live in now?");
* ``before``: the value before the change ("Which city did Amelie live in before moving?");
* ``never_changed``: a fact stated once ("What is the name of Bram's pet?").

Every history turn carries its kind (``metadata["turn_kind"]``: ``small_talk`` / ``first`` / ``change``) and its
gold memory operation (:mod:`memrl.memory.gold`: ADD for a first statement, UPDATE for a change, NOOP for small
talk), so ``memrl bench extract --dataset chats`` scores decisions and invented facts by turn kind, and
``memory.extractor: gold`` writes the perfect writer's memory on them.

The file (``memrl data make-chats OUT``) is a LoCoMo JSON array — ``sample_id``, ``conversation`` with
``speaker_a`` / ``speaker_b`` / ``session_N`` / ``session_N_date_time``, ``qa`` with ``question`` / ``answer`` /
``evidence`` / ``category`` (4, single-hop) — that the ``locomo`` adapter reads as well; each dialog turn adds
``kind`` and ``memory`` (its gold operation), each QA ``kind``. Without ``path`` the adapter generates the same
records in memory: chat ``i`` depends only on ``(seed, i)``, never on ``num_chats``.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from typing import Any

from memrl.adapters import chats_novel_text, chats_text, chats_train_text
from memrl.adapters.chats_text import ChatAttr
from memrl.adapters.locomo import _parse_conversation
from memrl.adapters.small_talk import SMALL_TALK as TRAINING_SMALL_TALK
from memrl.data.adapters import (
    ADAPTERS,
    DEFAULT_MAX_TURN_CHARS,
    AdapterError,
    RecordView,
    SkipReport,
    build_episode,
    iter_json_records,
    record_guard,
)
from memrl.types import BatchInput, TurnRole, TurnSpec

QUESTION_KINDS = ("now", "before", "never_changed")
SPLITS = ("train", "validation", "test", "all")
KINDS = ("seen", "novel")  # attribute kinds: the training chats' kinds, or kinds they never state
TURN_KINDS = ("small_talk", "first", "change")
_MEMORY_KEYS = {"op": "memory_op", "fact": "memory_fact", "person": "memory_person", "attr": "memory_attr",
                "value": "memory_value", "stale": "memory_stale"}  # fmt: skip


def _article(word: str) -> str:
    return "an" if word[0].lower() in "aeiou" else "a"


def _say(template: str, value: str, old: str = "") -> str:
    return template.format(v=value, V=value[:1].upper() + value[1:], a=_article(value), old=old,
                           Old=old[:1].upper() + old[1:], a_old=_article(old or "x"))  # fmt: skip


def _fact(attr: ChatAttr, person: str, value: str) -> str:
    return _say(attr.fact.replace("{p}", person), value)


@dataclass(frozen=True)
class ChatPool:
    """The words a chat is made of: speakers' names, attributes (values, wordings, questions), small talk."""

    names: tuple[str, ...]
    attrs: tuple[ChatAttr, ...]
    small_talk: tuple[str, ...]


HELD_OUT = ChatPool(chats_text.NAMES, chats_text.ATTRS, chats_text.SMALL_TALK)
NOVEL = ChatPool(chats_text.NAMES, chats_novel_text.ATTRS, chats_text.SMALL_TALK)
TRAINING = ChatPool(chats_train_text.NAMES, chats_train_text.ATTRS, TRAINING_SMALL_TALK)


def _pool(split: str, kinds: str) -> ChatPool:
    # test / all: a held-out pool; train / validation: the training pool (disjoint words, module doc).
    if kinds not in KINDS:
        raise ValueError(f"chats: kinds {kinds!r}; valid: {', '.join(KINDS)}")
    if split in ("train", "validation"):
        if kinds == "novel":
            raise ValueError(
                f"chats: kinds 'novel' are held out; a {split} split has the training kinds only"
            )
        return TRAINING
    return NOVEL if kinds == "novel" else HELD_OUT


class _ChatBuilder:
    """One chat's plan: the speakers' facts placed in (session, slot) positions of their own turns."""

    def __init__(self, rng: random.Random, pool: ChatPool, num_sessions: int, turns_per_session: int,
                 facts_per_speaker: int, changes: int) -> None:  # fmt: skip
        self.rng, self.pool = rng, pool
        self.sessions, self.per_session = num_sessions, turns_per_session
        self.speakers = rng.sample(pool.names, 2)
        self.slots: dict[tuple[int, int], dict[str, Any]] = {}
        self.used: set[tuple[str, str]] = set()  # (attribute, value): one value is one person's in a chat
        self.facts: list[dict[str, Any]] = []  # per (person, attr): values in order and their turn positions
        for k, person in enumerate(self.speakers):
            for attr in rng.sample(pool.attrs, facts_per_speaker):
                self.facts.append({"person": person, "side": k, "attr": attr, "values": [], "at": []})
        changeable = [f for f in self.facts if f["attr"].change]
        for f in rng.sample(changeable, min(changes, len(changeable))):
            first = rng.randrange(0, num_sessions - 1)
            later = rng.randrange(first + 1, num_sessions)
            old, new = self._draw(f["attr"]), self._draw(f["attr"])
            self._place(f, first, old)
            self._place(f, later, new, old)
        for f in self.facts:
            if not f["values"]:
                self._place(f, rng.randrange(0, num_sessions), self._draw(f["attr"]))

    def _draw(self, attr: ChatAttr) -> str:
        value = self.rng.choice([v for v in attr.values if (attr.name, v) not in self.used])
        self.used.add((attr.name, value))
        return value

    def _place(self, f: dict[str, Any], session: int, value: str, old: str = "") -> None:
        free = [t for t in range(f["side"], self.per_session, 2) if (session, t) not in self.slots]
        if not free:
            raise ValueError("chats: not enough turns per session for the facts; raise turns_per_session")
        slot = (session, self.rng.choice(free))
        attr: ChatAttr = f["attr"]
        text = _say(self.rng.choice(attr.change if old else attr.first), value, old)
        memory = {"op": "UPDATE" if old else "ADD", "fact": _fact(attr, f["person"], value),
                  "person": f["person"], "attr": attr.name, "value": value}  # fmt: skip
        if old:
            memory["stale"] = old
        self.slots[slot] = {"text": text, "kind": "change" if old else "first", "memory": memory}
        f["values"].append(value)
        f["at"].append(slot)

    def turns(self, dates: list[str]) -> dict[str, Any]:
        conv: dict[str, Any] = {"speaker_a": self.speakers[0], "speaker_b": self.speakers[1]}
        small_talk = self.pool.small_talk
        talk = self.rng.sample(small_talk, len(small_talk))
        for s in range(self.sessions):
            session = []
            for t in range(self.per_session):
                speaker = self.speakers[t % 2]
                item = self.slots.get((s, t))
                if item is None:
                    line = talk.pop() if talk else self.rng.choice(small_talk)
                    item = {"text": line.format(other=self.speakers[1 - t % 2]), "kind": "small_talk",
                            "memory": {"op": "NOOP"}}  # fmt: skip
                session.append({"speaker": speaker, "dia_id": f"D{s + 1}:{t + 1}", **item})
            conv[f"session_{s + 1}_date_time"] = dates[s]
            conv[f"session_{s + 1}"] = session
        return conv

    def questions(self, never: int) -> list[dict[str, Any]]:
        out = []
        changed = [f for f in self.facts if len(f["values"]) > 1]
        for f in changed:
            a, p = f["attr"], f["person"]
            (s0, t0), (s1, t1) = f["at"]
            out.append(_qa(a.now, p, f["values"][-1], f"D{s1 + 1}:{t1 + 1}", "now"))
            out.append(_qa(a.before, p, f["values"][0], f"D{s0 + 1}:{t0 + 1}", "before"))
        stable = [f for f in self.facts if len(f["values"]) == 1]
        for f in self.rng.sample(stable, min(never, len(stable))):
            (s0, t0) = f["at"][0]
            out.append(
                _qa(f["attr"].never, f["person"], f["values"][0], f"D{s0 + 1}:{t0 + 1}", "never_changed")
            )
        return out


def _qa(template: str, person: str, answer: str, evidence: str, kind: str) -> dict[str, Any]:
    return {"question": template.format(p=person), "answer": answer, "evidence": [evidence], "category": 4,
            "kind": kind}  # fmt: skip


def _dates(rng: random.Random, n: int) -> list[str]:
    day = dt.datetime(2024, 1, 1) + dt.timedelta(days=rng.randrange(0, 300))
    out = []
    for _ in range(n):
        day += dt.timedelta(days=rng.randint(20, 60))
        hour, minute = rng.randint(8, 21), rng.choice((0, 15, 30, 45))
        # LoCoMo's own format: "1:56 pm on 8 May, 2023"
        out.append(f"{(hour - 1) % 12 + 1}:{minute:02d} {'am' if hour < 12 else 'pm'} on {day.day} "
                   f"{day.strftime('%B')}, {day.year}")  # fmt: skip
    return out


def make_chat(seed: int, index: int, *, split: str = "test", num_sessions: int = 4, turns_per_session: int = 12,
              facts_per_speaker: int = 4, changes: int = 3, never_questions: int = 3,
              kinds: str = "seen") -> dict[str, Any]:  # fmt: skip
    """Chat ``index`` of ``split`` as one LoCoMo record (module doc); a pure function of its arguments. A
    training chat (``train`` / ``validation``) is marked with its split; ``kinds: novel`` makes a held-out chat of
    attribute kinds no training chat states (:mod:`memrl.adapters.chats_novel_text`)."""
    if split not in SPLITS:
        raise ValueError(f"chats: split {split!r}; valid: {', '.join(SPLITS)}")
    if num_sessions < 2:
        raise ValueError(
            f"chats: num_sessions must be >= 2 (a change happens in a later session), got {num_sessions}"
        )
    pool = _pool(split, kinds)
    if not 1 <= facts_per_speaker <= len(pool.attrs):
        raise ValueError(f"chats: facts_per_speaker must be in 1..{len(pool.attrs)}, got {facts_per_speaker}")
    held_out = pool is not TRAINING
    # The held-out chats' keys are the ones the published fixture was made with.
    tag = "" if pool is HELD_OUT else ("novel-" if pool is NOVEL else f"{split}-")
    rng = random.Random(f"memrl-chats{'-' + tag[:-1] if tag else ''}:{seed}:{index}")
    b = _ChatBuilder(rng, pool, num_sessions, turns_per_session, facts_per_speaker, changes)
    conversation = b.turns(_dates(rng, num_sessions))
    record = {
        "sample_id": f"chat-{tag}{seed}-{index}",
        "conversation": conversation,
        "qa": b.questions(never_questions),
    }
    return record if held_out else {"split": split, **record}


def make_chats(num_chats: int = 24, seed: int = 0, **options: Any) -> list[dict[str, Any]]:
    """``num_chats`` records (``memrl data make-chats``)."""
    if num_chats < 1:
        raise ValueError(f"chats: num_chats must be >= 1, got {num_chats}")
    return [make_chat(seed, i, **options) for i in range(num_chats)]


def _with_kinds(view: RecordView, record: Any, history: tuple[TurnSpec, ...]) -> list[TurnSpec]:
    """The turns with their kind and gold operation from the record (``kind`` / ``memory`` of each dialog turn)."""
    raw = {}
    conv = view.get(record, "conversation", dict)
    for key, turns in conv.items():
        if key.startswith("session_") and isinstance(turns, list):
            for i, t in enumerate(turns):
                raw[view.get(t, "dia_id", str, f"conversation.{key}[{i}]")] = (t, f"conversation.{key}[{i}]")
    out = []
    for turn in history:
        t, where = raw[turn.turn_id]
        kind = view.get(t, "kind", str, where)
        if kind not in TURN_KINDS:
            raise view.fail(f"{where}.kind", f"one of {', '.join(TURN_KINDS)}", repr(kind))
        memory = view.get(t, "memory", dict, where)
        meta = {
            _MEMORY_KEYS[k]: view.check(v, str, f"{where}.memory.{k}")
            for k, v in memory.items()
            if k in _MEMORY_KEYS
        }
        if "memory_op" not in meta:
            raise view.fail(f"{where}.memory.op", "ADD, UPDATE or NOOP")
        out.append(TurnSpec(turn.role, turn.text, turn.turn_id, turn.speaker, turn.timestamp,
                            {**turn.metadata, "turn_kind": kind, **meta}))  # fmt: skip
    return out


def _episodes(view: RecordView, record: Any) -> list[BatchInput]:
    conv = _parse_conversation(view, record, captions=False)
    history = _with_kinds(view, record, conv.history)
    turn_ids = {t.turn_id for t in history}
    out = []
    for qi, qa in enumerate(view.json_list(record, "qa")):
        where = f"qa[{qi}]"
        kind = view.get(qa, "kind", str, where)
        if kind not in QUESTION_KINDS:
            raise view.fail(f"{where}.kind", f"one of {', '.join(QUESTION_KINDS)}", repr(kind))
        question = view.get(qa, "question", str, where)
        evidence = [e for e in view.json_list(qa, "evidence", where) if e in turn_ids]
        episode_id = f"chats-{conv.sample_id}-q{qi}"
        target = TurnSpec(TurnRole.TARGET, question, "Q", "User")
        meta = {"sample_id": conv.sample_id, "qa_index": qi, "question_type": kind, "evidence_turn_ids": evidence,
                "session_dates": conv.session_dates, "speakers": list(conv.speakers)}  # fmt: skip
        out.append(build_episode(view, where, episode_id=episode_id, group_id=episode_id,
                                 turns=(*history, target), final_query=question,
                                 target_answer=view.text(view.get(qa, "answer", str, where), f"{where}.answer"),
                                 metadata=meta))  # fmt: skip
    return out


def _check_split(view: RecordView, record: Any, split: str) -> None:
    """A training split reads training chats only; ``test`` reads held-out chats only (``all``: either)."""
    made_for = view.get(record, "split", str) if isinstance(record, dict) and "split" in record else "test"
    if split == "all" or made_for == split:
        return
    if split in ("train", "validation"):
        raise view.fail("split", f"a {split} chat (memrl data make-chats --split {split})",
                        "a held-out chat: never train on or choose settings by them")  # fmt: skip
    raise view.fail("split", "a held-out chat (no split)", repr(made_for))


@ADAPTERS.register("chats")
def chats(path: str | None, *, split: str, lenient: bool, report: SkipReport, num_chats: int = 24, seed: int = 0,
          max_turn_chars: int = DEFAULT_MAX_TURN_CHARS, kinds: str = "seen", **shape: int) -> list[BatchInput]:  # fmt: skip
    """One episode per question of every chat: read from ``path`` (a file of ``memrl data make-chats``), or
    generated (``num_chats`` chats of ``seed``, ``shape``: :func:`make_chat`'s sizes) when ``path`` is empty.
    ``test`` is the held-out chats; ``train`` / ``validation`` are chats of the training pool
    (:mod:`memrl.adapters.chats_train_text`), which shares no word with them; ``all`` reads any file.
    ``kinds: novel`` generates held-out chats of attribute kinds the training chats never state."""
    if path in (None, "", "-"):
        made = "test" if split == "all" else split
        source = f"<chats split={made} kinds={kinds} num_chats={num_chats} seed={seed}>"
        records = list(enumerate(make_chats(int(num_chats), int(seed), split=made, kinds=kinds, **shape)))
    else:
        if kinds != "seen":
            shape = {**shape, "kinds": kinds}
        if shape:
            raise ValueError(f"chats: {', '.join(sorted(shape))} shape generated chats; {path} is a file")
        source, records = path, iter_json_records(path, lenient=lenient, report=report)
    out: list[BatchInput] = []
    for idx, record in records:
        with record_guard(report, lenient):
            view = RecordView(source, idx, int(max_turn_chars))
            _check_split(view, record, split)
            out.extend(_episodes(view, record))
    if not out:
        raise AdapterError(source, None, None, "at least one chat with questions")
    return out
