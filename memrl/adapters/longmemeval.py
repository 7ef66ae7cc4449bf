"""``longmemeval``: LongMemEval (``longmemeval_oracle.json`` / ``_s`` / ``_m``): one episode per question.

Haystack sessions become history turns in chronological order (the oracle file does not sort them, so they
are ordered by ``haystack_dates``; ties keep file order). ``turn_id`` is ``<session_id>:<i>``, ``speaker`` is
the role (``user``/``assistant``), ``timestamp`` the session date. The question is the target turn with
``question_date`` as its timestamp.

Metadata: ``question_id``, ``question_type``, ``answer_session_ids``, ``abstention`` (``question_id`` ending in
``_abs``: the information was never given, the gold answer explains that), ``haystack_session_ids`` and
``haystack_dates`` (file order), ``evidence_turn_ids`` (turns flagged ``has_answer``). List fields stored as JSON
text (some exports do that) are accepted. Numeric answers become plain strings.

Repeated sessions: the official ``_s``/``_m`` files repeat a session id inside one haystack (the same session,
identical content, at two dates). Each occurrence is kept, as what it is: the first keeps its id, the k-th
repeat (k ≥ 2, file order) gets ``<session_id>#<k>`` in its turn ids (``<session_id>#2:<i>``), so every turn id
stays unique; ``haystack_session_ids`` keeps the file's ids and ``evidence_turn_ids`` lists the flagged turns of
every occurrence. Strip ``#<k>`` to get the session a turn belongs to (``memrl bench memory`` does).

Splits: ``all`` is the whole file; ``train``/``test`` by a hash of ``question_id`` (``test_fraction`` in test).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
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

DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"  # e.g. "2023/05/21 (Sun) 19:50"
ABSTENTION_SUFFIX = "_abs"


def _parse_date(view: RecordView, value: Any, path: str) -> tuple[str, dt.datetime]:
    text = view.check(value, str, path)
    try:
        return text, dt.datetime.strptime(text, DATE_FORMAT)
    except ValueError:
        raise view.fail(path, "a date like '2023/05/21 (Sun) 19:50'", repr(text)) from None


def _session_turns(view: RecordView, session: Any, session_id: str, date: str, where: str) -> list[TurnSpec]:
    turns = view.check(session, list, where)
    if not turns:
        raise view.fail(where, "a non-empty list of turns", "an empty session")
    out = []
    for i, raw in enumerate(turns):
        path = f"{where}[{i}]"
        role = view.get(raw, "role", str, path)
        has_answer = view.get(raw, "has_answer", bool, path, optional=True)
        out.append(
            TurnSpec(
                role=TurnRole.HISTORY,
                text=view.get(raw, "content", str, path),
                turn_id=f"{session_id}:{i}",
                speaker=role,
                timestamp=date,
                metadata={"has_answer": True} if has_answer else {},
            )
        )
    return out


def _history(view: RecordView, record: Any) -> tuple[list[TurnSpec], list[str], list[str]]:
    sessions = view.json_list(record, "haystack_sessions")
    dates = view.json_list(record, "haystack_dates")
    ids = view.json_list(record, "haystack_session_ids")
    if not len(sessions) == len(dates) == len(ids):
        raise view.fail(
            "haystack_sessions",
            "haystack_sessions, haystack_dates and haystack_session_ids of equal length",
            f"lengths {len(sessions)}, {len(dates)}, {len(ids)}",
        )
    if not sessions:
        raise view.fail("haystack_sessions", "at least one session", "an empty list")
    parsed = [_parse_date(view, d, f"haystack_dates[{j}]") for j, d in enumerate(dates)]
    keys, seen = [], {}
    for j, raw_id in enumerate(ids):  # occurrence numbers follow file order, whatever the dates say
        sid = view.check(raw_id, str, f"haystack_session_ids[{j}]")
        seen[sid] = seen.get(sid, 0) + 1
        keys.append(sid if seen[sid] == 1 else f"{sid}#{seen[sid]}")
    order = sorted(range(len(sessions)), key=lambda j: parsed[j][1])
    history: list[TurnSpec] = []
    for j in order:
        history.extend(_session_turns(view, sessions[j], keys[j], parsed[j][0], f"haystack_sessions[{j}]"))
    return history, [str(i) for i in ids], [p[0] for p in parsed]


def _episode(view: RecordView, record: Any) -> BatchInput:
    qid = view.get(record, "question_id", str)
    question = view.get(record, "question", str)
    if not question.strip():
        raise view.fail("question", "a non-empty question")
    answer = view.text(view.get(record, "answer", (str, int, float)), "answer")
    qdate, _ = _parse_date(view, view.get(record, "question_date", str), "question_date")
    answer_sessions = [
        view.check(s, str, f"answer_session_ids[{i}]")
        for i, s in enumerate(view.json_list(record, "answer_session_ids"))
    ]
    history, session_ids, dates = _history(view, record)
    meta = {
        "question_id": qid,
        "question_type": view.get(record, "question_type", str),
        "answer_session_ids": answer_sessions,
        "abstention": qid.endswith(ABSTENTION_SUFFIX),
        "haystack_session_ids": session_ids,
        "haystack_dates": dates,
        "evidence_turn_ids": [t.turn_id for t in history if t.metadata.get("has_answer")],
    }
    target = TurnSpec(role=TurnRole.TARGET, text=question, turn_id="Q", speaker="user", timestamp=qdate)
    episode_id = f"longmemeval-{qid}"
    return build_episode(
        view,
        "question",
        episode_id=episode_id,
        group_id=episode_id,
        turns=(*history, target),
        final_query=question,
        target_answer=answer,
        metadata=meta,
    )


@ADAPTERS.register("longmemeval")
def longmemeval(
    path: str | None,
    *,
    split: str,
    lenient: bool,
    report: SkipReport,
    test_fraction: float = 0.5,
    max_turn_chars: int = DEFAULT_MAX_TURN_CHARS,
) -> Iterator[BatchInput]:
    """One episode per question record in ``path`` (a LongMemEval JSON array, or JSONL), yielded as each
    record is converted: a consumer that lets each episode go holds one haystack at a time."""
    if not path:
        raise AdapterError("<no path>", None, None, "the path of a LongMemEval JSON file")
    for idx, record in iter_json_records(path, lenient=lenient, report=report):
        view = RecordView(path, idx, int(max_turn_chars))
        episode = None
        with record_guard(report, lenient):
            episode = _episode(view, record)
        if episode is not None and in_split(episode.metadata["question_id"], split, float(test_fraction)):
            yield episode
