"""``chats``: held-out free-form two-person chats in LoCoMo's file format, for checking a memory writer on
conversations it never saw. **Never train on them or choose settings by them**: the adapter has no train split.

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
from typing import Any

from memrl.adapters.chats_text import ATTRS, NAMES, SMALL_TALK, ChatAttr
from memrl.adapters.locomo import _parse_conversation
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
TURN_KINDS = ("small_talk", "first", "change")
_MEMORY_KEYS = {"op": "memory_op", "fact": "memory_fact", "person": "memory_person", "attr": "memory_attr",
                "value": "memory_value", "stale": "memory_stale"}  # fmt: skip


def _article(word: str) -> str:
    return "an" if word[0].lower() in "aeiou" else "a"


def _say(template: str, value: str, old: str = "") -> str:
    return template.format(v=value, V=value[:1].upper() + value[1:], a=_article(value), old=old,
                           a_old=_article(old or "x"))  # fmt: skip


def _fact(attr: ChatAttr, person: str, value: str) -> str:
    return _say(attr.fact.replace("{p}", person), value)


class _ChatBuilder:
    """One chat's plan: the speakers' facts placed in (session, slot) positions of their own turns."""

    def __init__(self, rng: random.Random, num_sessions: int, turns_per_session: int, facts_per_speaker: int,
                 changes: int) -> None:  # fmt: skip
        self.rng = rng
        self.sessions, self.per_session = num_sessions, turns_per_session
        self.speakers = rng.sample(NAMES, 2)
        self.slots: dict[tuple[int, int], dict[str, Any]] = {}
        self.used: set[tuple[str, str]] = set()  # (attribute, value): one value is one person's in a chat
        self.facts: list[dict[str, Any]] = []  # per (person, attr): values in order and their turn positions
        for k, person in enumerate(self.speakers):
            for attr in rng.sample(ATTRS, facts_per_speaker):
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
        talk = self.rng.sample(SMALL_TALK, len(SMALL_TALK))
        for s in range(self.sessions):
            session = []
            for t in range(self.per_session):
                speaker = self.speakers[t % 2]
                item = self.slots.get((s, t))
                if item is None:
                    line = talk.pop() if talk else self.rng.choice(SMALL_TALK)
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


def make_chat(seed: int, index: int, *, num_sessions: int = 4, turns_per_session: int = 12,
              facts_per_speaker: int = 4, changes: int = 3, never_questions: int = 3) -> dict[str, Any]:  # fmt: skip
    """Chat ``index`` as one LoCoMo record (module doc); a pure function of its arguments."""
    if num_sessions < 2:
        raise ValueError(
            f"chats: num_sessions must be >= 2 (a change happens in a later session), got {num_sessions}"
        )
    if not 1 <= facts_per_speaker <= len(ATTRS):
        raise ValueError(f"chats: facts_per_speaker must be in 1..{len(ATTRS)}, got {facts_per_speaker}")
    rng = random.Random(f"memrl-chats:{seed}:{index}")
    b = _ChatBuilder(rng, num_sessions, turns_per_session, facts_per_speaker, changes)
    conversation = b.turns(_dates(rng, num_sessions))
    return {
        "sample_id": f"chat-{seed}-{index}",
        "conversation": conversation,
        "qa": b.questions(never_questions),
    }


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


@ADAPTERS.register("chats")
def chats(path: str | None, *, split: str, lenient: bool, report: SkipReport, num_chats: int = 24, seed: int = 0,
          max_turn_chars: int = DEFAULT_MAX_TURN_CHARS) -> list[BatchInput]:  # fmt: skip
    """One episode per question of every chat: read from ``path`` (a file of ``memrl data make-chats``), or
    generated (``num_chats`` chats of ``seed``) when ``path`` is empty. Splits ``test`` and ``all`` only."""
    if split not in ("test", "all"):
        raise ValueError(
            f"chats: split {split!r}; the chats are held out for evaluation (never trained on, never used to "
            "choose settings): valid splits are test and all"
        )
    if path in (None, "", "-"):
        source = f"<chats num_chats={num_chats} seed={seed}>"
        records = list(enumerate(make_chats(int(num_chats), int(seed))))
    else:
        source, records = path, iter_json_records(path, lenient=lenient, report=report)
    out: list[BatchInput] = []
    for idx, record in records:
        with record_guard(report, lenient):
            out.extend(_episodes(RecordView(source, idx, int(max_turn_chars)), record))
    if not out:
        raise AdapterError(source, None, None, "at least one chat with questions")
    return out
