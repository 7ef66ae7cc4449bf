"""``locomo``: LoCoMo (``locomo10.json``): every QA becomes one episode over its conversation's sessions.

History turns are every dialog turn in session order (``turn_id`` = LoCoMo's ``dia_id`` such as ``D1:3``,
``timestamp`` = that session's ``session_N_date_time``); a shared photo's caption is appended to the text as
``[shares photo: …]`` (option ``include_captions``). The target turn is the question.

Metadata: ``sample_id``, ``category`` (1–5), ``evidence`` (the dialog ids as written, normalised: a few
annotations pack several ids into one string such as ``"D8:6; D9:17"``), ``evidence_turn_ids`` (those evidence
ids that exist in the conversation), ``evidence_unresolved`` (tokens that are not a dialog id of this
conversation, kept so nothing is lost), ``session_dates``, ``speakers``, ``qa_index``. Category 5 questions are
adversarial (the premise is false; LoCoMo gives an ``adversarial_answer`` instead of ``answer``): their
``target_answer`` is ``None`` and ``metadata["adversarial"]`` is ``True``.

Splits are by conversation, named by ``sample_id`` (never by position in the file), so the questions of one
conversation never cross splits and a test conversation is never seen in training. ``all`` is the whole file.
Option ``split_scheme``:

* ``hash`` (default): ``train``/``test`` by a hash of ``sample_id``, ``test_fraction`` of conversations in test.
* ``memory_r1``: the split Memory-R1 reports on: ``train`` = ``conv-26`` (152 questions of categories 1–4),
  ``validation`` = ``conv-30`` (81), ``test`` = the other eight conversations (1,307). Category-5 questions come
  with their conversation (47 / 24 / 375); episodes are ordered by ``sample_id``, then question.

Option ``test_sample`` (a share in (0, 1], default 1): the ``test`` split keeps that share of every
(conversation, category) stratum, rounded up: the questions whose hash of ``sample_id:qa_index`` is lowest. The
sample is stratified, fixed and independent of the file's order (``configs/locomo_train.yaml``: 0.25 of the
memory_r1 test conversations = 339 questions of categories 1–4 and 96 adversarial).

Option ``abstention_answer``: the ``target_answer`` category-5 questions get (default ``None``: no gold).
The ``locomo`` reward scores them by abstention either way; a gold string lets gold demonstrations
(``train.replay.demonstrations: gold``) teach the phrase the official scorer accepts.

Option ``gold_memory``:

* ``none`` (default): history turns carry no gold memory operations (outcome-only credit for a policy writer).
* ``observations``: LoCoMo's own per-session ``observation`` facts (written by the dataset's authors with an
  LLM, each citing the dialog turns it rests on) become the turns' gold operations (:mod:`memrl.memory.gold`):
  a turn some observations cite last gets ``memory_op: ADD`` with those observations joined as its
  ``memory_fact``; every other turn ``NOOP``. ``memory.extractor: gold`` then writes a strong LLM writer's
  memory (the ceiling check of a trained writer), and a policy writer's warm start imitates it. An
  observation citing no dialog id of its conversation is an error naming it.

Option ``question_format``:

* ``plain`` (default): the question as written.
* ``official``: as LoCoMo's own evaluation asks (``task_eval/gpt_utils.py``). A temporal question (category 2)
  ends with ``Use DATE of CONVERSATION to answer with an approximate date.``; an adversarial one becomes a
  two-way choice, ``Select the correct answer: (a) … (b) …``, between ``Not mentioned in the conversation`` and
  its ``adversarial_answer``. The official script draws the order at random; here it is fixed by a hash of
  ``sample_id:qa_index``, so every run asks the same question. ``metadata["choices"]`` maps ``a``/``b`` to the
  options, and the ``locomo`` reward reads a letter answer as the option it names. A category-5 question
  without an ``adversarial_answer`` stays plain.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from memrl.data.adapters import (
    ADAPTERS,
    DEFAULT_MAX_TURN_CHARS,
    AdapterError,
    RecordView,
    SkipReport,
    build_episode,
    in_split,
    iter_json_records,
    record_guard,
)
from memrl.types import BatchInput, TurnRole, TurnSpec

_SESSION_KEY = re.compile(r"session_(\d+)")
_DIA_ID = re.compile(r"D\d+:\d+")
ADVERSARIAL_CATEGORY = 5
# Memory-R1 (Yan et al., 2025): the file's first conversation trains, its second validates, the rest test.
MEMORY_R1_SPLIT = {"conv-26": "train", "conv-30": "validation"}
SPLIT_SCHEMES = ("hash", "memory_r1")
QUESTION_FORMATS = ("plain", "official")
GOLD_MEMORY = ("none", "observations")
NOT_MENTIONED = "Not mentioned in the conversation"
TEMPORAL_HINT = " Use DATE of CONVERSATION to answer with an approximate date."


@dataclass(frozen=True)
class _Conversation:
    sample_id: str
    history: tuple[TurnSpec, ...]
    session_dates: dict[str, str]
    speakers: tuple[str, ...]


def _turn(view: RecordView, raw: Any, where: str, date: str, captions: bool) -> TurnSpec:
    dia_id = view.get(raw, "dia_id", str, where)
    text = view.get(raw, "text", str, where)
    caption = view.get(raw, "blip_caption", str, where, optional=True)
    if captions and caption:
        text = f"{text} [shares photo: {caption}]"
    return TurnSpec(
        role=TurnRole.HISTORY,
        text=text,
        turn_id=dia_id,
        speaker=view.get(raw, "speaker", str, where),
        timestamp=date,
    )


def _observations(view: RecordView, record: Any, turn_ids: set[str]) -> dict[str, list[tuple[str, str]]]:
    """LoCoMo's observation facts (with the person each is about) by the dialog turn that completes them: the
    last turn each one cites."""
    raw = view.get(record, "observation", dict)
    by_turn: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for key, speakers in raw.items():
        for speaker, facts in view.check(speakers, dict, f"observation.{key}").items():
            for i, item in enumerate(view.check(facts, list, f"observation.{key}.{speaker}")):
                where = f"observation.{key}.{speaker}[{i}]"
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                    raise view.fail(where, "a [fact, dialog id(s)] pair", repr(item)[:80])
                cited = item[1] if isinstance(item[1], list) else [item[1]]
                ids = [t for c in cited for t in _DIA_ID.findall(str(c))]
                if not ids or any(t not in turn_ids for t in ids):
                    raise view.fail(where, "dialog ids of this conversation", repr(item[1]))
                by_turn[max(ids, key=_dia_order)].append((speaker, item[0].strip()))
    return by_turn


def _dia_order(dia_id: str) -> tuple[int, int]:
    session, turn = dia_id[1:].split(":")
    return int(session), int(turn)


def _with_gold(history: list[TurnSpec], by_turn: dict[str, list[tuple[str, str]]]) -> list[TurnSpec]:
    out = []
    for t in history:
        facts = by_turn.get(t.turn_id)
        meta = (
            {
                "memory_op": "ADD",
                "memory_fact": " ".join(fact for _, fact in facts),
                # whom the (first) observation is about: a reply can complete a fact about the other speaker
                "memory_person": facts[0][0],
                "memory_value": "",
            }
            if facts
            else {"memory_op": "NOOP"}
        )
        out.append(replace(t, metadata={**t.metadata, **meta}))
    return out


def _parse_conversation(
    view: RecordView, record: Any, captions: bool, gold_memory: str = "none"
) -> _Conversation:
    sample_id = view.get(record, "sample_id", str)
    conv = view.get(record, "conversation", dict)
    numbers = sorted(int(m.group(1)) for key in conv if (m := _SESSION_KEY.fullmatch(key)))
    if not numbers:
        raise view.fail(
            "conversation", "at least one 'session_N' list of dialog turns", f"keys {sorted(conv)}"
        )
    history: list[TurnSpec] = []
    dates: dict[str, str] = {}
    for n in numbers:
        key = f"session_{n}"
        date = view.get(conv, f"{key}_date_time", str, "conversation")
        turns = view.check(conv[key], list, f"conversation.{key}")
        if not turns:
            raise view.fail(f"conversation.{key}", "a non-empty list of dialog turns", "an empty session")
        dates[key] = date
        history.extend(
            _turn(view, t, f"conversation.{key}[{i}]", date, captions) for i, t in enumerate(turns)
        )
    seen: set[str] = set()
    for turn in history:
        if turn.turn_id in seen:
            raise view.fail("conversation", "unique dia_id values", f"{turn.turn_id!r} appears twice")
        seen.add(turn.turn_id)
    if gold_memory == "observations":
        history = _with_gold(history, _observations(view, record, seen))
    speakers = tuple(
        s
        for s in (view.get(conv, k, str, "conversation", optional=True) for k in ("speaker_a", "speaker_b"))
        if s
    )
    return _Conversation(sample_id, tuple(history), dates, speakers)


def _evidence(view: RecordView, qa: Any, where: str, turn_ids: set[str]) -> dict[str, list[str]]:
    raw = view.json_list(qa, "evidence", where)
    tokens: list[str] = []
    for i, item in enumerate(raw):
        tokens.extend(t for t in re.split(r"[;,\s]+", view.check(item, str, f"{where}.evidence[{i}]")) if t)
    ids = [t for t in tokens if _DIA_ID.fullmatch(t)]
    return {
        "evidence": ids,
        "evidence_turn_ids": [t for t in ids if t in turn_ids],
        "evidence_unresolved": [t for t in tokens if t not in turn_ids],
    }


def _official_question(question: str, meta: dict[str, Any]) -> str:
    """The question as LoCoMo's evaluation asks it (module doc); records the choices in ``meta``."""
    if meta["category"] == 2:
        return question + TEMPORAL_HINT
    trap = meta.get("adversarial_answer")
    if not meta["adversarial"] or not trap:
        return question
    key = f"{meta['sample_id']}:{meta['qa_index']}".encode("utf-8", "surrogateescape")
    first = hashlib.sha1(key).digest()[0] % 2 == 0
    a, b = (NOT_MENTIONED, trap) if first else (trap, NOT_MENTIONED)
    meta["choices"] = {"a": a, "b": b}
    return f"{question} Select the correct answer: (a) {a} (b) {b}."


def _qa_episode(
    view: RecordView,
    conv: _Conversation,
    qi: int,
    qa: Any,
    turn_ids: set[str],
    abstention: str | None,
    question_format: str,
) -> BatchInput:
    where = f"qa[{qi}]"
    question = view.get(qa, "question", str, where)
    if not question.strip():
        raise view.fail(f"{where}.question", "a non-empty question")
    category = view.get(qa, "category", int, where)
    if not 1 <= category <= 5:
        raise view.fail(f"{where}.category", "an integer in 1..5", repr(category))
    adversarial = category == ADVERSARIAL_CATEGORY
    meta: dict[str, Any] = {
        "sample_id": conv.sample_id,
        "qa_index": qi,
        "category": category,
        "adversarial": adversarial,
        "session_dates": conv.session_dates,
        "speakers": list(conv.speakers),
        **_evidence(view, qa, where, turn_ids),
    }
    if adversarial:
        answer = abstention
        adv = view.get(qa, "adversarial_answer", (str, int, float), where, optional=True)
        meta["adversarial_answer"] = None if adv is None else view.text(adv, f"{where}.adversarial_answer")
        if (
            qa.get("answer") is not None
        ):  # two category-5 items carry one; keep it, but the gold is abstention
            meta["original_answer"] = view.text(qa["answer"], f"{where}.answer")
    else:
        answer = view.text(view.get(qa, "answer", (str, int, float), where), f"{where}.answer")
    if question_format == "official":
        question = _official_question(question, meta)
    episode_id = f"locomo-{conv.sample_id}-q{qi}"
    target = TurnSpec(role=TurnRole.TARGET, text=question, turn_id="Q", speaker="User")
    return build_episode(
        view,
        where,
        episode_id=episode_id,
        group_id=episode_id,
        turns=(*conv.history, target),
        final_query=question,
        target_answer=answer,
        metadata=meta,
    )


def _conversation_split(sample_id: str, scheme: str, test_fraction: float) -> str:
    if scheme == "memory_r1":
        return MEMORY_R1_SPLIT.get(sample_id, "test")
    return "test" if in_split(sample_id, "test", test_fraction) else "train"


def _stratified(episodes: list[BatchInput], share: float) -> list[BatchInput]:
    """``share`` of each category's questions (rounded up), those of lowest hash; the episodes' order is kept."""
    if share >= 1.0:
        return episodes
    strata: dict[int, list[BatchInput]] = defaultdict(list)
    for ep in episodes:
        strata[ep.metadata["category"]].append(ep)

    def rank(ep: BatchInput) -> str:
        key = f"{ep.metadata['sample_id']}:{ep.metadata['qa_index']}"
        return hashlib.sha1(key.encode("utf-8", "surrogateescape")).hexdigest()

    kept = {
        ep.episode_id
        for group in strata.values()
        for ep in sorted(group, key=rank)[: math.ceil(share * len(group))]
    }
    return [ep for ep in episodes if ep.episode_id in kept]


@ADAPTERS.register("locomo")
def locomo(
    path: str | None,
    *,
    split: str,
    lenient: bool,
    report: SkipReport,
    split_scheme: str = "hash",
    test_fraction: float = 0.5,
    test_sample: float = 1.0,
    abstention_answer: str | None = None,
    question_format: str = "plain",
    gold_memory: str = "none",
    include_captions: bool = True,
    max_turn_chars: int = DEFAULT_MAX_TURN_CHARS,
) -> list[BatchInput]:
    """One episode per QA of every conversation in ``path`` (a LoCoMo JSON array) in ``split`` (module doc)."""
    if not path:
        raise AdapterError("<no path>", None, None, "the path of a LoCoMo JSON file (e.g. locomo10.json)")
    if split_scheme not in SPLIT_SCHEMES:
        raise ValueError(f"locomo: split_scheme={split_scheme!r}; valid: {', '.join(SPLIT_SCHEMES)}")
    if question_format not in QUESTION_FORMATS:
        raise ValueError(f"locomo: question_format={question_format!r}; valid: {', '.join(QUESTION_FORMATS)}")
    if gold_memory not in GOLD_MEMORY:
        raise ValueError(f"locomo: gold_memory={gold_memory!r}; valid: {', '.join(GOLD_MEMORY)}")
    if split == "validation" and split_scheme != "memory_r1":
        raise ValueError("locomo: split 'validation' exists only with option split_scheme: memory_r1")
    if not 0.0 < float(test_sample) <= 1.0:
        raise ValueError(f"locomo: test_sample must be a share in (0, 1], got {test_sample}")
    by_conversation: list[tuple[str, list[BatchInput]]] = []
    for idx, record in iter_json_records(path, lenient=lenient, report=report):
        view = RecordView(path, idx, int(max_turn_chars))
        with record_guard(report, lenient):
            conv = _parse_conversation(view, record, bool(include_captions), gold_memory)
            qas = view.json_list(record, "qa")
            side = _conversation_split(conv.sample_id, split_scheme, float(test_fraction))
            if split != "all" and side != split:
                continue
            turn_ids = {t.turn_id for t in conv.history}
            episodes: list[BatchInput] = []
            for qi, qa in enumerate(qas):
                with record_guard(report, lenient):
                    episodes.append(
                        _qa_episode(view, conv, qi, qa, turn_ids, abstention_answer, question_format)
                    )
            if side == "test":
                episodes = _stratified(episodes, float(test_sample))
            by_conversation.append((conv.sample_id, episodes))
    if split_scheme == "memory_r1":
        # A named split: the same episodes in the same order whatever the file's order.
        by_conversation.sort(key=lambda item: item[0])
    return [ep for _, episodes in by_conversation for ep in episodes]
