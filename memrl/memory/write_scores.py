"""Scores of memory writes against the synthetic task's known decisions: per-op confusion, precision and recall,
right-target UPDATEs, malformed replies and the end state of every changed fact.

The synthetic task (:mod:`memrl.adapters.synthetic`) puts each history turn's right decision in its metadata (any
phrasing; the fixed templates are also read by :func:`~memrl.adapters.synthetic.parse_statement`). Used by
``memrl bench extract`` (every extractor) and by the writer's warm start, which checks the writer it trained on
training episodes it did not imitate (:mod:`memrl.train.warm_start`).
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from memrl.adapters.synthetic import parse_statement
from memrl.memory.extract import MALFORMED_REASON
from memrl.memory.faithfulness import FaithfulnessTally, turn_kind, unsupported_facts
from memrl.memory.gold import holds as gold_holds
from memrl.memory.manager import MemorySystem
from memrl.memory.writer import FORMAT_REASON
from memrl.types import BatchInput, MemoryOp, MemoryOpType, TurnSpec

ADD, UPDATE, DELETE, NOOP = MemoryOpType.ADD, MemoryOpType.UPDATE, MemoryOpType.DELETE, MemoryOpType.NOOP
OPS = (ADD, UPDATE, DELETE, NOOP)

# Reason fragments of memrl.memory.extract.LlmOutputError → a short label for the breakdown.
_MALFORMED_KINDS = (
    ("no JSON found", "no_json"),
    ("invalid JSON", "invalid_json"),
    ("is not one of the shown ids", "bad_id"),
    ("is not ADD/UPDATE/DELETE/NOOP", "bad_op"),
    ("without text", "missing_text"),
    ("expected an object", "not_an_object"),
    ("expected a list", "not_a_list"),
    ("does not start with ADD/UPDATE/DELETE/NOOP", "bad_op"),
    ("needs a shown id", "bad_id"),
    ("empty reply", "empty"),
)
# A number alone does not say which attribute a fact is about ("Mia has 3 pets" vs "Mia has 3 siblings").
_NUMERIC_KEYWORDS = {
    "age": r"years?|old|age",
    "siblings": r"siblings?|brothers?|sisters?",
    "pets": r"pets?",
    "savings": r"savings?|saved|dollars?",
}
EXAMPLES_PER_OP = 2
ERRORS_PER_PAIR = 5  # wrong decisions kept per (expected, decided) pair: what a writer gets wrong, to read


@dataclass(frozen=True)
class Expected:
    """The right decision for one history turn. ``stale``: the value an UPDATE replaces."""

    op: MemoryOpType
    person: str = ""
    attr: str = ""
    value: str = ""
    stale: str = ""


def expected_decisions(history: Sequence[TurnSpec]) -> list[Expected]:
    """The right decision for each turn of one episode's history, in order: the gold operation the adapter put in
    the turn's metadata (any phrasing), else read from the fixed templates."""
    if all(t.metadata.get("memory_op") for t in history):
        return [_from_metadata(t) for t in history]
    latest: dict[tuple[str, str], str] = {}
    out = []
    for turn in history:
        parsed = parse_statement(turn.text)
        if parsed is None:
            out.append(Expected(NOOP))
            continue
        person, attr, value, _ = parsed
        prev = latest.get((person, attr))
        latest[(person, attr)] = value
        op = ADD if prev is None else (UPDATE if prev != value else NOOP)
        out.append(Expected(op, person, attr, value, prev or ""))
    return out


def _from_metadata(turn: TurnSpec) -> Expected:
    m = turn.metadata
    if m["memory_op"] == "NOOP" and "memory_person" not in m:
        return Expected(NOOP)
    return Expected(
        MemoryOpType(m["memory_op"]),
        m["memory_person"],
        m.get("memory_attr", ""),  # LoCoMo's observations name a person, no attribute or value
        m.get("memory_value", ""),
        m.get("memory_stale", ""),
    )


def holds(text: str, person: str, attr: str, value: str) -> bool:
    """Does a fact text state ``person``'s ``attr`` = ``value``? (Both as words; numbers also need a word of
    the attribute.) Model-written facts are paraphrases, so this is a word test, not a template match."""
    words = set(re.findall(r"[a-z0-9]+", text.lower()))
    if person.lower() not in words or (value and value.lower() not in words):
        return False
    keyword = _NUMERIC_KEYWORDS.get(attr)
    return keyword is None or re.search(rf"\b({keyword})\b", text.lower()) is not None


def turn_op(ops: Sequence[MemoryOp]) -> MemoryOpType:
    """One op per turn for the confusion matrix: UPDATE, else DELETE, else ADD, else NOOP."""
    kinds = {o.op for o in ops}
    return next((op for op in (UPDATE, DELETE, ADD) if op in kinds), NOOP)


def malformed_kind(reason: str) -> str:
    return next((label for fragment, label in _MALFORMED_KINDS if fragment in reason), "other")


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


@dataclass
class ExtractScores:
    """Turn-level counts for one extractor; :meth:`summary` turns them into the bench's JSON."""

    confusion: dict[MemoryOpType, Counter] = field(default_factory=lambda: {op: Counter() for op in OPS})
    update_right_target: int = 0
    delete_ops: int = 0
    chitchat_turns: int = 0
    chitchat_adds: int = 0
    multi_op_turns: int = 0
    malformed: Counter = field(default_factory=Counter)
    end_state: Counter = field(default_factory=Counter)
    examples: list[dict] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    faith: FaithfulnessTally = field(default_factory=FaithfulnessTally)

    def add_turn(
        self,
        turn: TurnSpec,
        truth: Expected,
        ops: Sequence[MemoryOp],
        before: dict[int, str],
        reply: str = "",
        shown: Sequence[str] = (),
        read: Sequence[TurnSpec] = (),
    ) -> None:
        """Score one turn's ops; ``before``: the episode's active facts (id → text) when the turn was decided;
        ``read``: the turns its write read (default the turn alone), which its facts must be true to
        (:mod:`memrl.memory.faithfulness`)."""
        got = turn_op(ops)
        facts = [o.text for o in ops if o.op in (ADD, UPDATE)]
        read = tuple(read) or (turn,)
        invented = unsupported_facts(facts, read)
        self.faith.add(
            turn_kind(turn), len(facts), invented, " / ".join(f"{t.speaker}: {t.text}" for t in read)
        )
        self.confusion[truth.op][got] += 1
        self.delete_ops += sum(o.op is DELETE for o in ops)
        self.multi_op_turns += len([o for o in ops if o.op is not NOOP]) > 1
        right_target = truth.op is UPDATE and any(
            o.op is UPDATE and holds(before.get(o.fact_ids[0], ""), truth.person, truth.attr, truth.stale)
            for o in ops
        )
        self.update_right_target += right_target
        if not truth.person:
            self.chitchat_turns += 1
            self.chitchat_adds += got is ADD
        for o in ops:
            if o.op is NOOP and o.text.startswith((MALFORMED_REASON, FORMAT_REASON)):
                self.malformed[malformed_kind(o.text)] += 1
        if reply and sum(e["expected"] == truth.op.value for e in self.examples) < EXAMPLES_PER_OP:
            self.examples.append(
                {"turn": turn.text, "expected": truth.op.value, "decided": got.value, "reply": reply[:300]}
            )
        if reply and (got is not truth.op or (got is UPDATE and not right_target)):
            self._add_error(turn, truth, got, ops, before, reply, shown)

    def _add_error(
        self,
        turn: TurnSpec,
        truth: Expected,
        got: MemoryOpType,
        ops: Sequence[MemoryOp],
        before: dict,
        reply: str,
        shown: Sequence[str],
    ) -> None:
        pair = (truth.op.value, got.value if got is not truth.op else "UPDATE of the wrong fact")
        if sum((e["expected"], e["decided"]) == pair for e in self.errors) >= ERRORS_PER_PAIR:
            return
        # For a wrong UPDATE, the fact it replaced: a person's other fact, or another person's?
        targets = [before.get(o.fact_ids[0], "?") for o in ops if o.op is UPDATE and o.fact_ids]
        self.errors.append({"turn": turn.text, "expected": pair[0], "decided": pair[1], "reply": reply[:300],
                            "updated": targets, "memory": list(before.values()), "shown": list(shown)})  # fmt: skip

    def add_end_state(
        self,
        truths: Sequence[Expected],
        facts: Sequence[str],
        question_key: tuple | None,
        history: Sequence[str] = (),
    ) -> None:
        """For every (person, attribute) that changed: does ``facts`` (the current fact texts at the end) hold
        the latest value, and none of the earlier ones? And is an earlier value kept in ``history`` (facts an
        UPDATE superseded)?"""
        values: dict[tuple[str, str], list[str]] = {}
        for t in truths:
            if t.person and t.op is not NOOP:
                values.setdefault((t.person, t.attr), []).append(t.value)
        for key, seen in values.items():
            if len(seen) < 2:
                continue
            latest = any(holds(f, *key, seen[-1]) for f in facts)
            stale_gone = not any(holds(f, *key, v) for f in facts for v in seen[:-1])
            self.end_state["history_kept"] += any(holds(f, *key, v) for f in history for v in seen[:-1])
            for prefix in ("", "question_") if key == question_key else ("",):
                self.end_state[f"{prefix}keys"] += 1
                self.end_state[f"{prefix}latest_present"] += latest
                self.end_state[f"{prefix}stale_gone"] += stale_gone
                self.end_state[f"{prefix}correct"] += latest and stale_gone

    def summary(self) -> dict:
        turns = sum(sum(c.values()) for c in self.confusion.values())
        decided = Counter()
        for row in self.confusion.values():
            decided.update(row)
        expected = {op: sum(self.confusion[op].values()) for op in OPS}
        hits = {op: self.confusion[op][op] for op in OPS}
        end = self.end_state
        return {
            "turns": turns,
            "expected": {op.value: expected[op] for op in OPS if expected[op]},
            "confusion": {
                e.value: {d.value: self.confusion[e][d] for d in OPS if self.confusion[e][d]}
                for e in OPS
                if expected[e]
            },
            "precision": {op.value: _ratio(hits[op], decided[op]) for op in OPS},
            "recall": {op.value: _ratio(hits[op], expected[op]) for op in OPS},
            "accuracy": _ratio(sum(hits.values()) - hits[UPDATE] + self.update_right_target, turns),
            "update_target_accuracy": _ratio(self.update_right_target, hits[UPDATE]),
            "update_recall_right_target": _ratio(self.update_right_target, expected[UPDATE]),
            "delete_ops": self.delete_ops,
            "chitchat_add_rate": _ratio(self.chitchat_adds, self.chitchat_turns),
            "multi_op_turns": self.multi_op_turns,
            "malformed_replies": sum(self.malformed.values()),
            "malformed_rate": _ratio(sum(self.malformed.values()), turns),
            "malformed_by_reason": dict(self.malformed),
            "end_state": {
                "changed_keys": end["keys"],
                "latest_present": _ratio(end["latest_present"], end["keys"]),
                "stale_gone": _ratio(end["stale_gone"], end["keys"]),
                "correct": _ratio(end["correct"], end["keys"]),
                "stale_kept_as_history": _ratio(end["history_kept"], end["keys"]),
                "update_questions": end["question_keys"],
                "update_questions_correct": _ratio(end["question_correct"], end["question_keys"]),
            },
            "faithfulness": self.faith.summary(),
            "examples": self.examples,
            "errors": self.errors,
        }


def question_key(ep: BatchInput) -> tuple[str, str] | None:
    """(person, attribute) an ``update`` question asks about (its evidence turn is the latest statement)."""
    if ep.metadata.get("question_type") != "update":
        return None
    turns = {t.turn_id: t for t in ep.history}
    evidence = turns[ep.metadata["evidence_turn_ids"][0]]
    if evidence.metadata.get("memory_attr"):  # the adapter says (any wording)
        return evidence.metadata["memory_person"], evidence.metadata["memory_attr"]
    parsed = parse_statement(evidence.text)
    return None if parsed is None else parsed[:2]


def attribute(turns: Sequence[TurnSpec], ops: Sequence[MemoryOp]) -> list[list[MemoryOp]]:
    """A chunk write's ops, per turn: line k is turn k's when the reply has one line per turn (what the writer
    is taught); otherwise each op goes to the turn whose person and value it names (none: it is dropped)."""
    if len(ops) == len(turns):
        return [[op] for op in ops]
    out: list[list[MemoryOp]] = [[] for _ in turns]
    for op in ops:
        for k, turn in enumerate(turns):
            m = turn.metadata
            if m.get("memory_person") and gold_holds(op.text, m["memory_person"], m.get("memory_value", "")):
                out[k].append(op)
                break
    return out


def score_writes(
    system: MemorySystem,
    episodes: Sequence[BatchInput],
    *,
    chunk: int = 1,
    desc: str = "",
    recorder=None,
) -> dict:
    """Ingest ``episodes`` with ``system``'s extractor (greedy) and score every history turn's decisions.
    ``chunk``: turns per policy write (as ``episode.ingest_chunk_turns`` in training). ``desc``: show a progress
    bar with this label. ``recorder``: the text generator of a non-policy extractor, whose ``last`` replies are
    kept as examples. The episodes' namespaces are released at the end."""
    mgrs = [system.manager(ep.episode_id) for ep in episodes]
    truths = [expected_decisions(ep.history) for ep in episodes]
    scores = ExtractScores()
    steps = max((len(ep.history) for ep in episodes), default=0)
    policy_writes = system.extractor.writes_steps
    size = max(1, chunk or steps) if policy_writes else 1  # chunk 0: the whole history in one write
    seconds, writes_done, bad_writes = 0.0, 0, 0
    try:
        for i in tqdm(
            range(0, steps, size), desc=desc, unit="write", file=sys.stderr, disable=not desc, mininterval=2.0
        ):
            live = [j for j, ep in enumerate(episodes) if i < len(ep.history)]
            before = [{f.fact_id: f.text for f in mgrs[j].facts()} for j in live]
            if recorder is not None:
                recorder.last = []
            t0 = time.perf_counter()
            # One turn (or chunk) per episode per call: an update has to see the fact its earlier statement left.
            if policy_writes:  # the policy writes, as in training
                writes = system.write_batch([(mgrs[j], episodes[j].history[i : i + size]) for j in live])
                per_turn = [attribute(w.turns, w.ops) for w in writes]
                replies = [w.samples[0].text for w in writes]
                shown = [[f"{k}. {f.text}" for k, f in enumerate(w.neighbours)] for w in writes]
                turns_read = [w.turns for w in writes]
                writes_done += len(writes)
                bad_writes += sum(bool(w.samples[0].ops.errors) for w in writes)
            else:
                results = system.extract_facts_batch([(mgrs[j], episodes[j].history[i]) for j in live])
                per_turn = [[ops] for ops in results]
                replies = recorder.last if recorder is not None and recorder.last else [""] * len(live)
                shown = [[] for _ in live]
                turns_read = [(episodes[j].history[i],) for j in live]
            seconds += time.perf_counter() - t0
            for j, turn_ops, facts, reply, read, turns in zip(
                live, per_turn, before, replies, shown, turns_read, strict=True
            ):
                for k, ops in enumerate(turn_ops):
                    scores.add_turn(
                        episodes[j].history[i + k],
                        truths[j][i + k],
                        ops,
                        facts,
                        reply if k == 0 else "",
                        read,
                        turns,
                    )
        for ep, mgr, truth in zip(episodes, mgrs, truths, strict=True):
            current = [f.text for f in mgr.facts() if not f.superseded]
            old = [f.text for f in mgr.facts() if f.superseded]
            scores.add_end_state(truth, current, question_key(ep), old)
        turns = sum(len(ep.history) for ep in episodes)
        result = scores.summary()
        result.update(
            facts_per_episode=round(sum(len(m.facts()) for m in mgrs) / max(1, len(mgrs)), 2),
            wall_seconds=round(seconds, 3),
            seconds_per_turn=round(seconds / max(1, turns), 4),
        )
    finally:
        for ep in episodes:
            system.release(ep.episode_id)
    if writes_done:  # policy writes: replies with any invalid line, and the batch size each call had
        result.update(writes=writes_done, malformed_write_rate=_ratio(bad_writes, writes_done),
                      episodes_per_call=len(episodes))  # fmt: skip
    return result
