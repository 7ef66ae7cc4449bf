"""``memrl bench memory``: evidence recall of memrl's retrieval on LoCoMo / LongMemEval, with baselines.

Conversations are streamed: the adapter hands over one history's episodes at a time
(:func:`~memrl.data.adapters.stream_adapter`), the history is ingested (rule extractor, batched), its questions are
retrieved, and its memory is released before the next one, so a LongMemEval ``_s``/``_m`` file (one ~115 k-token
haystack per question) never holds more than one haystack's episodes and index (the file's text is read whole).
Reported, in one run:

* ``recall@K`` (K = 5, 10, 25): mean over questions of the fraction of gold ids found among the source ids of
  everything retrieved with top_k = K, i.e. K hits with their neighbours, as windows or budgeted passages
  (LoCoMo: dialog ids, categories 1–4 by default; LongMemEval: answer session ids, a retrieved turn
  ``<session>:<i>`` counts for its session; the baselines: the first K turns). ``turn_recall@K``: the same over gold *turns*
  (LoCoMo: the evidence dialog ids; LongMemEval: the ``has_answer`` turns, where flagged). Per category / question
  type: ``recall@10_by_category``.
* ``baseline_dense_recall@K`` / ``baseline_bm25_recall@K`` (and ``..._by_category``): plain MiniLM cosine and
  plain BM25 over the raw turn texts, one item per turn, in the same run.
* ``context_token_fraction``: tokens of the texts retrieved at ``top_k`` / tokens of the whole history
  (``speaker: text`` per turn), averaged over questions (embedder tokenizer). This keeps recall honest: an item
  that swallowed a whole session would otherwise win.
* ``ingest_turns_per_s``, ``wall_seconds`` and the persistent embedding cache's hits, misses and hit rate
  (``memory.embedding_cache``: a second run over the same data encodes nothing again).

Options: ``--dataset locomo|longmemeval``, ``--path`` (default: the small bundled fixture of the format, for a
smoke run; pass your copy of the data for real numbers), ``--limit N`` (conversations / questions),
``--categories 1,2,3,4``, ``--no-baselines``, and ``key=value`` MemoryConfig overrides
(``neighbour_turns=1 retrieval=dense``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rank_bm25 import BM25Okapi
from tqdm import tqdm

from memrl.bench import BENCHES
from memrl.memory.config import MemoryConfig
from memrl.memory.embedder import Embedder, build_embedder, window_chunks
from memrl.memory.manager import MemorySystem, RetrievedFact
from memrl.types import BatchInput, TurnSpec

logger = logging.getLogger(__name__)

DATASETS = ("locomo", "longmemeval")
KS = (5, 10, 25)


def fixture_path(dataset: str) -> Path:
    """The small bundled sample of ``dataset``'s format (``memrl.adapters``)."""
    from memrl.adapters import LOCOMO_FIXTURE, LONGMEMEVAL_FIXTURE

    return LOCOMO_FIXTURE if dataset == "locomo" else LONGMEMEVAL_FIXTURE


@dataclass
class Conversation:
    """One history shared by several questions (LoCoMo: a conversation; LongMemEval: one question each)."""

    key: str
    turns: tuple[TurnSpec, ...]
    questions: list[Question]


@dataclass(frozen=True)
class Question:
    text: str
    gold: tuple[str, ...]  # dialog ids (LoCoMo) or session ids (LongMemEval)
    category: str
    gold_turns: tuple[str, ...] = ()  # evidence turn ids (LongMemEval: has_answer turns, when flagged)
    asked_at: str | None = None  # the question's date (LongMemEval: question_date), for relative times
    asked_by: str | None = None  # the question's speaker (the target turn's), whom "I"/"my" refers to


GoldMapper = Callable[[Sequence[str]], set[str]]


def _locomo_ids(source_ids: Sequence[str]) -> set[str]:
    return set(source_ids)


def _session_ids(source_ids: Sequence[str]) -> set[str]:
    # LongMemEval turn ids are "<session_id>:<i>" (the session id itself may contain ':'), with "#<k>" after the
    # id of a session's k-th occurrence in one haystack (see the adapter): every occurrence is that session.
    return {re.sub(r"#\d+$", "", s.rsplit(":", 1)[0]) for s in source_ids}


def iter_conversations(
    dataset: str, path: str, categories: set[int], limit: int | None
) -> Iterator[Conversation]:
    """Episodes from the dataset adapters (``memrl.adapters``), streamed and grouped by shared history (the
    adapters yield one history's episodes consecutively; one episode is read ahead to see where a history ends);
    histories without a scored question are passed over, ``limit`` counts histories read."""
    from memrl.data.adapters import stream_adapter

    episodes, report = stream_adapter(dataset, path, split="all")
    current: Conversation | None = None
    done: set[str] = set()
    for ep in episodes:
        key = str(ep.metadata.get("sample_id", ep.episode_id))
        if current is None or key != current.key:
            if key in done:
                raise ValueError(
                    f"{path}: the episodes of history {key!r} are not consecutive in the adapter's output"
                )
            if current is not None:
                done.add(current.key)
                if current.questions:
                    yield current
            if limit is not None and len(done) >= limit:
                current = None
                break
            current = Conversation(key, ep.history, [])
        question = _question(dataset, ep, categories)
        if question is not None:
            current.questions.append(question)
    if current is not None and current.questions:
        yield current
    if report.skipped:
        logger.warning("%s: adapter skipped %d records: %s", path, report.skipped, report.reasons()[:3])


def _question(dataset: str, ep: BatchInput, categories: set[int]) -> Question | None:
    meta = ep.metadata
    if dataset == "locomo":
        if int(meta["category"]) not in categories or not meta.get("evidence_turn_ids"):
            return None
        ids = tuple(meta["evidence_turn_ids"])
        return Question(ep.final_query, ids, str(meta["category"]), ids, asked_by=ep.target.speaker)
    gold = tuple(meta.get("answer_session_ids") or ())
    if not gold or meta.get("abstention"):
        return None
    return Question(
        ep.final_query,
        gold,
        str(meta["question_type"]),
        tuple(meta.get("evidence_turn_ids") or ()),
        ep.target.timestamp,
        ep.target.speaker,
    )


# ---------------------------------------------------------------------------------------------------------
# Scoring


def recall(
    ranked_sources: Sequence[Sequence[str]], gold: Sequence[str], k: int, to_gold: GoldMapper
) -> float:
    """Fraction of ``gold`` covered by the source ids of the first ``k`` items."""
    found: set[str] = set()
    for sources in ranked_sources[:k]:
        found |= to_gold(sources)
    return len(found & set(gold)) / len(set(gold))


def raw_text(turn: TurnSpec) -> str:
    return turn.text


def baseline_rankings(
    embedder: Embedder, conv: Conversation, qvecs: np.ndarray, kmax: int
) -> tuple[list[list[str]], list[list[str]]]:
    """Plain dense and plain BM25 over the raw turns (one item per turn): per question, top turn ids. Dense
    embeds each turn's first window, i.e. what MiniLM reads of it anyway (it truncates), no chunking: the text
    is then memrl's first chunk and comes from the embedding cache."""
    texts = [raw_text(t) for t in conv.turns]
    ids = [t.turn_id for t in conv.turns]
    mat = embedder.encode([pieces[0] for pieces in window_chunks(embedder, texts)])
    dense = [[ids[i] for i in np.argsort(-(mat @ q), kind="stable")[:kmax]] for q in qvecs]
    bm25 = BM25Okapi([re.findall(r"\w+", t.lower()) for t in texts])
    lexical = []
    for q in conv.questions:
        scores = bm25.get_scores(re.findall(r"\w+", q.text.lower()))
        lexical.append([ids[i] for i in np.argsort(-scores, kind="stable")[:kmax]])
    return dense, lexical


class Scores:
    """Per-question recall lists for one ranking method, by K and by category."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.by_k: dict[str, list[float]] = defaultdict(list)
        self.by_cat: dict[str, list[float]] = defaultdict(list)

    def add(self, ranked: Sequence[Sequence[str]], q: Question, to_gold: GoldMapper) -> None:
        """``ranked``: the items' source ids, best first; recall@K counts the first K items."""
        self.add_contexts({k: ranked[:k] for k in KS}, q, to_gold)

    def add_contexts(
        self, contexts: dict[int, Sequence[Sequence[str]]], q: Question, to_gold: GoldMapper
    ) -> None:
        """``contexts[K]``: the source ids of everything retrieved with top_k = K; recall@K counts all of it."""
        for k in KS:
            self.by_k[f"recall@{k}"].append(recall(contexts[k], q.gold, len(contexts[k]), to_gold))
            if q.gold_turns:
                self.by_k[f"turn_recall@{k}"].append(recall(contexts[k], q.gold_turns, len(contexts[k]), set))
        self.by_cat[q.category].append(self.by_k["recall@10"][-1])

    def summary(self) -> dict:
        out = {f"{self.prefix}{name}": float(np.mean(v)) for name, v in self.by_k.items()}
        out[f"{self.prefix}recall@10_by_category"] = {
            c: round(float(np.mean(v)), 4) for c, v in sorted(self.by_cat.items())
        }
        return out


def evaluate_conversation(
    system: MemorySystem, conv: Conversation, to_gold: GoldMapper, scores: Scores, fractions: list[float]
) -> None:
    """Retrieve every question of ``conv`` (already ingested) at top_k = K for each K and score it; the context
    share is that of the top_k the config names. With passages (``neighbour_turns`` > 0) the context at K is not
    a prefix of the context at a larger K, so each K is its own retrieval."""
    mgr = system.manager(conv.key)
    history_tokens = sum(system.embedder.count_tokens([f.text for f in mgr.facts()]))
    items = [(mgr, q.text) for q in conv.questions]
    asked_at = [q.asked_at for q in conv.questions]
    asked_by = [q.asked_by for q in conv.questions]
    per_k = {
        k: system.retrieve_batch(items, k, asked_at=asked_at, asked_by=asked_by)
        for k in sorted({*KS, system.cfg.top_k})
    }
    for i, q in enumerate(conv.questions):
        scores.add_contexts({k: [h.source_ids for h in per_k[k][i]] for k in KS}, q, to_gold)
        fractions.append(_context_tokens(system, per_k[system.cfg.top_k][i]) / max(1, history_tokens))


def _context_tokens(system: MemorySystem, hits: Sequence[RetrievedFact]) -> int:
    return sum(system.embedder.count_tokens([h.text for h in hits])) if hits else 0


def score_baselines(
    embedder: Embedder, conv: Conversation, to_gold: GoldMapper, dense: Scores, bm25: Scores
) -> None:
    qvecs = embedder.encode([q.text for q in conv.questions])
    by_dense, by_bm25 = baseline_rankings(embedder, conv, qvecs, max(KS))
    for q, d, b in zip(conv.questions, by_dense, by_bm25, strict=True):
        dense.add([[i] for i in d], q, to_gold)
        bm25.add([[i] for i in b], q, to_gold)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The options; ``overrides`` comes back as MemoryConfig keyword arguments."""
    p = argparse.ArgumentParser(prog="memrl bench memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=DATASETS, default="locomo")
    p.add_argument("--path", help="dataset file (default: the bundled fixture of the format, a smoke run)")
    p.add_argument("--limit", type=int, help="first N conversations (LoCoMo) / questions (LongMemEval)")
    p.add_argument("--categories", default="1,2,3,4", help="LoCoMo QA categories to score")
    p.add_argument("--no-baselines", action="store_true", help="skip the raw-turn baselines")
    p.add_argument("overrides", nargs="*", help="MemoryConfig key=value overrides")
    args = p.parse_args(argv)
    args.overrides = memory_overrides(p, args.overrides)
    return args


def memory_overrides(p: argparse.ArgumentParser, items: Sequence[str]) -> dict:
    """``key=value`` MemoryConfig overrides → constructor kwargs, typed like the field's default; a bad item
    is a usage error naming the valid keys."""
    fields = {f.name: f for f in dataclasses.fields(MemoryConfig)}
    kwargs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            p.error(f"override {item!r}: expected key=value with key in {sorted(fields)}")
        default = fields[key].default
        kwargs[key] = type(default)(value) if default is not None and not isinstance(default, bool) else value
        if isinstance(default, bool):
            kwargs[key] = value.lower() in ("1", "true", "yes")
    return kwargs


def _cache_delta(before: dict, after: dict) -> dict:
    """This run's embedding-cache counts (the embedder, and its counters, outlive one bench call)."""
    if not after:
        return {}
    hits = after["memory/embed_cache_hits"] - before["memory/embed_cache_hits"]
    misses = after["memory/embed_cache_misses"] - before["memory/embed_cache_misses"]
    return {
        "memory/embed_cache_hits": hits,
        "memory/embed_cache_misses": misses,
        "memory/embed_cache_hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        "memory/embed_cache_writes_stopped": after["memory/embed_cache_writes_stopped"],
    }


@BENCHES.register("memory")
def bench_memory(argv: list[str]) -> dict:
    args = parse_args(argv)
    cfg = MemoryConfig(**args.overrides)
    if args.path is None:
        logger.warning(
            "bench memory: no --path, running on the bundled %s fixture (a smoke run)", args.dataset
        )
    path = args.path or str(fixture_path(args.dataset))
    convs = iter_conversations(args.dataset, path, {int(c) for c in args.categories.split(",")}, args.limit)
    to_gold = _locomo_ids if args.dataset == "locomo" else _session_ids
    embedder = build_embedder(cfg)
    system = MemorySystem(cfg, embedder=embedder)
    cache_before = getattr(embedder, "stats", dict)()
    memrl, dense, bm25 = Scores(""), Scores("baseline_dense_"), Scores("baseline_bm25_")
    fractions: list[float] = []
    facts = turns = n_convs = n_questions = 0
    ingest_s = 0.0
    t0 = time.perf_counter()
    bar = tqdm(
        convs, desc="bench memory", unit="history", file=sys.stderr, dynamic_ncols=True, mininterval=2.0
    )
    for conv in bar:
        ta = time.perf_counter()
        system.extract_facts_batch([(system.manager(conv.key), t) for t in conv.turns])
        ingest_s += time.perf_counter() - ta
        turns += len(conv.turns)
        evaluate_conversation(system, conv, to_gold, memrl, fractions)
        facts += len(system.manager(conv.key).facts())
        system.release(conv.key)  # one haystack's index at a time
        if not args.no_baselines:
            score_baselines(embedder, conv, to_gold, dense, bm25)
        n_convs, n_questions = n_convs + 1, n_questions + len(conv.questions)
        bar.set_postfix(turns_per_s=f"{turns / max(ingest_s, 1e-9):.0f}")
    if not n_questions:
        raise ValueError(f"{path}: no questions with gold evidence (dataset {args.dataset})")
    result = {
        "dataset": args.dataset,
        "path": path,
        "conversations": n_convs,
        "questions": n_questions,
        "facts": facts,
        "history_turns": turns,
        "ingest_seconds": round(ingest_s, 3),
        "ingest_turns_per_s": turns / max(ingest_s, 1e-9),
        "wall_seconds": round(time.perf_counter() - t0, 3),
        # ru_maxrss is in KiB on Linux: the process's peak, model and file text included
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "embedder_dtype": getattr(embedder, "dtype", "float32"),  # as resolved (the config may say auto)
        "config": dataclasses.asdict(cfg),
        "context_token_fraction": float(np.mean(fractions)),
        **memrl.summary(),
        **_cache_delta(cache_before, getattr(embedder, "stats", dict)()),
    }
    if not args.no_baselines:
        result.update(dense.summary())
        result.update(bm25.summary())
    return result
