"""``memrl bench extract``: how right the fact extractors' ADD / UPDATE / DELETE / NOOP decisions are.

The synthetic task (:mod:`memrl.adapters.synthetic`) states attributes of persons among chit-chat, and changes some
of them in a later session, so every history turn has a known right decision
(:func:`~memrl.adapters.synthetic.parse_statement` reads its templated turns):

* the first statement of a (person, attribute) → ``ADD``;
* a later statement with another value (the "now" turns) → ``UPDATE`` of the fact that holds the earlier value:
  the right op **and** the right target fact (a fact naming the person and the stale value);
* anything else (chit-chat, a repeated value) → ``NOOP``. An ADD for chit-chat is a false ADD (reported
  separately as ``chitchat_add_rate``: noise in the store rather than a lost fact);
* the task has no retractions, so every ``DELETE`` is wrong (``delete_ops``).

Each extractor ingests the same episodes the way the product does (real MiniLM embedder, real FAISS store,
``MemorySystem.extract_facts_batch``), one history turn of every episode per call, so a turn is decided against
the memory the turns before it left (one call decides all its turns against the memory at its start). The
``llm`` extractor asks the embedded policy (``PolicyConfig()``: SmolLM2-135M-Instruct, greedy) through
:func:`~memrl.memory.llm.policy_text_generator`. Reported per extractor: the turn-level confusion of expected vs
decided op (a turn's op is its UPDATE, else DELETE, else ADD, else NOOP), per-op precision and recall, UPDATE
target accuracy, malformed replies (the extractor turns them into NOOPs) by reason, an end-state check for every
changed (person, attribute) — the active facts hold the latest value and no longer the stale one — also for the
update questions alone, wall seconds and (llm) prompt / completion tokens per turn, and a few raw replies.

Options: ``--episodes N`` (test split, 4 by default), ``--extractor rule|llm|both`` (both, the default: side by
side in one JSON), ``--seed``, and ``key=value`` MemoryConfig overrides (``llm_neighbours=3``). The defaults are
the run docs/benchmarks.md reports, replies capped at :data:`LLM_MAX_TOKENS` tokens for CPU time.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from memrl.adapters.synthetic import parse_statement
from memrl.adapters.synthetic_phrasing import PHRASINGS
from memrl.bench import BENCHES
from memrl.bench.memory import memory_overrides
from memrl.memory.config import MemoryConfig
from memrl.memory.embedder import Embedder, build_embedder
from memrl.memory.extract import MALFORMED_REASON, TextGenerator
from memrl.memory.gold import holds as gold_holds
from memrl.memory.manager import MemorySystem
from memrl.memory.writer import FORMAT_REASON
from memrl.types import BatchInput, MemoryOp, MemoryOpType, TurnSpec

logger = logging.getLogger(__name__)

ADD, UPDATE, DELETE, NOOP = MemoryOpType.ADD, MemoryOpType.UPDATE, MemoryOpType.DELETE, MemoryOpType.NOOP
OPS = (ADD, UPDATE, DELETE, NOOP)
EXTRACTOR_CHOICES = ("rule", "llm", "policy", "both")
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
        m["memory_attr"],
        m["memory_value"],
        m.get("memory_stale", ""),
    )


def holds(text: str, person: str, attr: str, value: str) -> bool:
    """Does a fact text state ``person``'s ``attr`` = ``value``? (Both as words; numbers also need a word of
    the attribute.) Model-written facts are paraphrases, so this is a word test, not a template match."""
    words = set(re.findall(r"[a-z0-9]+", text.lower()))
    if person.lower() not in words or value.lower() not in words:
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

    def add_turn(
        self,
        turn: TurnSpec,
        truth: Expected,
        ops: Sequence[MemoryOp],
        before: dict[int, str],
        reply: str = "",
        shown: Sequence[str] = (),
    ) -> None:
        """Score one turn's ops; ``before``: the episode's active facts (id → text) when the turn was decided."""
        got = turn_op(ops)
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
            "examples": self.examples,
            "errors": self.errors,
        }


# ---------------------------------------------------------------------------------------------------------
# Running an extractor over the episodes


class CountingClient:
    """A PolicyClient wrapper that counts prompt and completion tokens (what ``policy_text_generator`` uses)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.prompt_tokens = 0
        self.completion_tokens = 0
        # The writer switches to its own adapter through this (a per-role run's adapter/memory/).
        if hasattr(inner, "use_adapter"):
            self.use_adapter = inner.use_adapter

    def generate(self, requests):
        outputs = self.inner.generate(requests)
        self.prompt_tokens += sum(len(r.prompt_ids) for r in requests)
        self.completion_tokens += sum(len(outs[0].token_ids) for outs in outputs)
        return outputs


class _Recorder:
    """Keeps the replies of the latest ``generate_text`` call (one per turn of the extraction call)."""

    def __init__(self, generate_text: TextGenerator) -> None:
        self.generate_text = generate_text
        self.client = getattr(generate_text, "client", None)  # what the policy extractor generates with
        self.last: list[str] = []

    def __call__(self, prompts: list[str]) -> list[str]:
        self.last = self.generate_text(prompts)
        return self.last


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


def run_extractor(
    episodes: Sequence[BatchInput],
    cfg: MemoryConfig,
    *,
    embedder: Embedder,
    generate_text: TextGenerator | None = None,
    desc: str = "",
    chunk: int = 1,
) -> dict:
    """Ingest ``episodes`` with ``cfg.extractor`` and score every history turn's decisions (see the module doc).
    ``desc``: show a progress bar with this label. ``chunk``: turns per policy write (as
    ``episode.ingest_chunk_turns`` in training)."""
    recorder = _Recorder(generate_text) if generate_text is not None else None
    system = MemorySystem(cfg, embedder=embedder, generate_text=recorder)
    mgrs = [system.manager(ep.episode_id) for ep in episodes]
    truths = [expected_decisions(ep.history) for ep in episodes]
    scores = ExtractScores()
    steps = max((len(ep.history) for ep in episodes), default=0)
    policy_writes = getattr(system.extractor, "writes_steps", False)
    size = chunk if policy_writes else 1
    seconds, writes_done, bad_writes = 0.0, 0, 0
    for i in tqdm(
        range(0, steps, size), desc=desc, unit="write", file=sys.stderr, disable=not desc, mininterval=2.0
    ):
        live = [j for j, ep in enumerate(episodes) if i < len(ep.history)]
        before = [{f.fact_id: f.text for f in mgrs[j].facts()} for j in live]
        if recorder is not None:
            recorder.last = []
        t0 = time.perf_counter()
        # One turn (or one chunk) per episode per call: an update has to see the fact its earlier statement left.
        if policy_writes:  # the policy writes, as in training
            writes = system.write_batch([(mgrs[j], episodes[j].history[i : i + size]) for j in live])
            per_turn = [attribute(w.turns, w.ops) for w in writes]
            replies = [w.samples[0].text for w in writes]
            shown = [[f"{k}. {f.text}" for k, f in enumerate(w.neighbours)] for w in writes]
            writes_done += len(writes)
            bad_writes += sum(bool(w.samples[0].ops.errors) for w in writes)
        else:
            results = system.extract_facts_batch([(mgrs[j], episodes[j].history[i]) for j in live])
            per_turn = [[ops] for ops in results]
            replies = recorder.last if recorder is not None and recorder.last else [""] * len(live)
            shown = [[] for _ in live]
        seconds += time.perf_counter() - t0
        for j, turn_ops, facts, reply, read in zip(live, per_turn, before, replies, shown, strict=True):
            for k, ops in enumerate(turn_ops):
                scores.add_turn(
                    episodes[j].history[i + k], truths[j][i + k], ops, facts, reply if k == 0 else "", read
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
    if writes_done:  # policy writes: replies with any invalid line, and the batch size each call had
        result.update(writes=writes_done, malformed_write_rate=_ratio(bad_writes, writes_done),
                      episodes_per_call=len(episodes))  # fmt: skip
    for ep in episodes:
        system.release(ep.episode_id)
    return result


def _policy_generator(cfg: MemoryConfig, overrides: dict) -> tuple[TextGenerator, CountingClient, str]:
    import torch

    from memrl.memory.llm import policy_text_generator
    from memrl.policy import PolicyConfig, make_policy
    from memrl.threads import auto_threads

    torch.set_num_threads(auto_threads())  # on a busy machine one thread decodes faster than two that wait

    # The embedded default policy (SmolLM2-135M-Instruct), built as `memrl run` builds it.
    policy_cfg = PolicyConfig(**overrides)
    client = CountingClient(make_policy(policy_cfg))
    generate_text = policy_text_generator(client, max_tokens=cfg.llm_max_tokens)
    model = policy_cfg.model + (f" + LoRA {policy_cfg.lora_path}" if policy_cfg.lora_path else "")
    return generate_text, client, model


def _policy_overrides(p: argparse.ArgumentParser, items: Sequence[str]) -> dict:
    """``policy.KEY=VALUE`` items → PolicyConfig kwargs (strings; the bench's model settings are all paths/names)."""
    import dataclasses

    from memrl.policy import PolicyConfig

    valid = {f.name for f in dataclasses.fields(PolicyConfig)}
    out = {}
    for item in items:
        key, sep, value = item[len("policy.") :].partition("=")
        if not sep or key not in valid:
            p.error(f"override {item!r}: expected policy.KEY=VALUE with KEY in {sorted(valid)}")
        out[key] = value
    return out


LLM_MAX_TOKENS = 64  # reply cap of the llm extractor here (MemoryConfig's own default: 256)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options; ``overrides`` comes back as MemoryConfig keyword arguments over the bench's defaults."""
    p = argparse.ArgumentParser(prog="memrl bench extract", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--episodes", type=int, default=4, help="synthetic test-split episodes (18 history turns each)"
    )
    p.add_argument("--extractor", choices=EXTRACTOR_CHOICES, default="both")
    p.add_argument("--seed", type=int, default=0, help="the synthetic adapter's data seed")
    p.add_argument(
        "--chunk",
        type=int,
        default=1,
        help="turns per policy write (episode.ingest_chunk_turns of the training)",
    )
    p.add_argument(
        "--phrasing",
        choices=PHRASINGS,
        default="fixed",
        help="how the synthetic task words facts and changes",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        help=f"MemoryConfig key=value overrides (default llm_max_tokens={LLM_MAX_TOKENS}), and policy.KEY=VALUE "
        "for the llm / policy extractors' model (policy.lora_path=runs/x/checkpoints/step_000010/adapter)",
    )
    args = p.parse_args(argv)
    args.policy_overrides = _policy_overrides(p, [o for o in args.overrides if o.startswith("policy.")])
    memory = memory_overrides(p, [o for o in args.overrides if not o.startswith("policy.")])
    args.overrides = {"llm_max_tokens": LLM_MAX_TOKENS, **memory}
    if "extractor" in args.overrides:
        p.error("name the extractor with --extractor rule|llm|both, not extractor=...")
    if args.episodes < 1:
        p.error(f"--episodes must be >= 1, got {args.episodes}")
    return args


@BENCHES.register("extract")
def bench_extract(argv: list[str]) -> dict:
    args = parse_args(argv)
    overrides, policy_overrides = args.overrides, args.policy_overrides
    from memrl.data.adapters import run_adapter

    episodes, _ = run_adapter(
        "synthetic",
        None,
        split="test",
        options={"num_episodes": args.episodes, "seed": args.seed, "phrasing": args.phrasing},
    )
    names = ("rule", "llm") if args.extractor == "both" else (args.extractor,)
    embedder = build_embedder(MemoryConfig(**overrides))
    result: dict = {
        "episodes": len(episodes),
        "history_turns": sum(len(ep.history) for ep in episodes),
        "seed": args.seed,
        "phrasing": args.phrasing,
        "chunk": args.chunk,
        "overrides": {**overrides, **{f"policy.{k}": v for k, v in policy_overrides.items()}},
    }
    for name in names:
        cfg = MemoryConfig(**{**overrides, "extractor": name})
        generate_text, client, model = (
            _policy_generator(cfg, policy_overrides) if name != "rule" else (None, None, "")
        )
        t0 = time.perf_counter()
        # The bench counts malformed replies itself; one warning per reply would bury the progress bar.
        extract_log = logging.getLogger("memrl.memory.extract")
        level = extract_log.level
        extract_log.setLevel(logging.ERROR)
        try:
            scores = run_extractor(
                episodes,
                cfg,
                embedder=embedder,
                generate_text=generate_text,
                desc=f"bench extract ({name})",
                chunk=args.chunk,
            )
        finally:
            extract_log.setLevel(level)
        if client is not None:
            turns = result["history_turns"]
            scores["model"] = f"{model} (greedy)"
            scores["prompt_tokens_per_turn"] = round(client.prompt_tokens / turns, 1)
            scores["completion_tokens_per_turn"] = round(client.completion_tokens / turns, 1)
        scores["total_seconds"] = round(time.perf_counter() - t0, 3)  # with model loading
        result[name] = scores
    return result
