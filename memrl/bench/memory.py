"""``memrl bench memory``: evidence recall of memrl's retrieval on LoCoMo / LongMemEval, with baselines.

For every conversation the history is ingested once (rule extractor, one batched call for all
conversations), then every question with gold evidence is retrieved. Reported, in one run:

* ``recall@K``: mean over questions of the fraction of gold ids found among the source ids of the top-K
  retrieved items (LoCoMo: dialog ids, categories 1–4 by default; LongMemEval: answer session ids, a
  retrieved turn ``<session>:<i>`` counts for its session).
* ``baseline_dense_recall@K`` / ``baseline_bm25_recall@K``: plain MiniLM cosine and plain BM25 over the raw
  turn texts, one item per turn.
* ``context_token_fraction``: tokens of the top-``top_k`` retrieved texts / tokens of the whole history
  (``speaker: text`` per turn), averaged over questions (embedder tokenizer). This keeps recall honest: an item
  that swallowed a whole session would otherwise win.
* ``ingest_ratio``: ingest throughput / bare ``encode()`` throughput of the same fact texts (same run).

Options: ``--dataset locomo|longmemeval``, ``--path``, ``--limit N`` (conversations / questions),
``--categories 1,2,3,4``, ``--repeats R`` (timing repeats; min is taken), and ``key=value`` MemoryConfig
overrides (``neighbour_turns=1 retrieval=dense``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import re
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rank_bm25 import BM25Okapi

from memrl.bench import BENCHES
from memrl.memory.config import MemoryConfig
from memrl.memory.embedder import Embedder, build_embedder
from memrl.memory.manager import MemorySystem, RetrievedFact
from memrl.types import BatchInput, TurnSpec

logger = logging.getLogger(__name__)

DATA_ROOT = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DEFAULT_PATHS = {
    "locomo": DATA_ROOT / "locomo" / "locomo10.json",
    "longmemeval": DATA_ROOT / "longmemeval" / "longmemeval_oracle.json",
}
KS = (5, 10, 25)


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


GoldMapper = Callable[[Sequence[str]], set[str]]


def _locomo_ids(source_ids: Sequence[str]) -> set[str]:
    return set(source_ids)


def _session_ids(source_ids: Sequence[str]) -> set[str]:
    # LongMemEval turn ids are "<session_id>:<i>" (the session id itself may contain ':'), with "#<k>" after the
    # id of a session's k-th occurrence in one haystack (see the adapter): every occurrence is that session.
    return {re.sub(r"#\d+$", "", s.rsplit(":", 1)[0]) for s in source_ids}


def load_conversations(
    dataset: str, path: str, categories: set[int], limit: int | None
) -> list[Conversation]:
    """Episodes from the dataset adapters (``memrl_adapters``), grouped by shared history."""
    from memrl.data.adapters import run_adapter

    episodes, report = run_adapter(dataset, path, split="all")
    if report.skipped:
        logger.warning("%s: adapter skipped %d records: %s", path, report.skipped, report.reasons()[:3])
    convs: dict[str, Conversation] = {}
    for ep in episodes:
        question = _question(dataset, ep, categories)
        key = str(ep.metadata.get("sample_id", ep.episode_id))
        if key not in convs:
            if limit is not None and len(convs) >= limit:
                continue
            convs[key] = Conversation(key, ep.history, [])
        if question is not None:
            convs[key].questions.append(question)
    return [c for c in convs.values() if c.questions]


def _question(dataset: str, ep: BatchInput, categories: set[int]) -> Question | None:
    meta = ep.metadata
    if dataset == "locomo":
        if int(meta["category"]) not in categories or not meta.get("evidence_turn_ids"):
            return None
        return Question(ep.final_query, tuple(meta["evidence_turn_ids"]), str(meta["category"]))
    gold = tuple(meta.get("answer_session_ids") or ())
    if not gold or meta.get("abstention"):
        return None
    return Question(ep.final_query, gold, str(meta["question_type"]))


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
    """Plain dense and plain BM25 over the raw turns (one item per turn): per question, top turn ids."""
    texts = [raw_text(t) for t in conv.turns]
    ids = [t.turn_id for t in conv.turns]
    mat = embedder.encode(texts)
    dense = [[ids[i] for i in np.argsort(-(mat @ q), kind="stable")[:kmax]] for q in qvecs]
    bm25 = BM25Okapi([re.findall(r"\w+", t.lower()) for t in texts])
    lexical = []
    for q in conv.questions:
        scores = bm25.get_scores(re.findall(r"\w+", q.text.lower()))
        lexical.append([ids[i] for i in np.argsort(-scores, kind="stable")[:kmax]])
    return dense, lexical


def ingest(system: MemorySystem, convs: Sequence[Conversation]) -> tuple[float, float]:
    """Rule-extract every history turn of every conversation in one batched call; (wall, cpu) seconds."""
    items = [(system.manager(c.key), t) for c in convs for t in c.turns]
    wall, cpu = time.perf_counter(), time.process_time()
    system.extract_facts_batch(items)
    return time.perf_counter() - wall, time.process_time() - cpu


def _timed_encode(embedder: Embedder, texts: list[str]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    embedder.encode(texts)
    return time.perf_counter() - wall, time.process_time() - cpu


def evaluate(system: MemorySystem, convs: Sequence[Conversation], to_gold: GoldMapper) -> dict:
    """memrl retrieval recall@K and context fraction (the system must already hold the conversations)."""
    kmax = max(KS)
    per_cat: dict[str, list[float]] = defaultdict(list)
    recalls: dict[int, list[float]] = {k: [] for k in KS}
    fractions = []
    for conv in convs:
        mgr = system.manager(conv.key)
        history_tokens = sum(system.embedder.count_tokens([f.text for f in mgr.facts()]))
        hits_per_q = system.retrieve_batch([(mgr, q.text) for q in conv.questions], kmax)
        for q, hits in zip(conv.questions, hits_per_q, strict=True):
            sources = [h.source_ids for h in hits]
            for k in KS:
                recalls[k].append(recall(sources, q.gold, k, to_gold))
            per_cat[q.category].append(recalls[10][-1])
            fractions.append(_context_tokens(system, hits[: system.cfg.top_k]) / max(1, history_tokens))
    out = {f"recall@{k}": float(np.mean(v)) for k, v in recalls.items()}
    out["context_token_fraction"] = float(np.mean(fractions))
    out["recall@10_by_category"] = {c: round(float(np.mean(v)), 4) for c, v in sorted(per_cat.items())}
    return out


def _context_tokens(system: MemorySystem, hits: Sequence[RetrievedFact]) -> int:
    return sum(system.embedder.count_tokens([h.text for h in hits])) if hits else 0


def evaluate_baselines(embedder: Embedder, convs: Sequence[Conversation], to_gold: GoldMapper) -> dict:
    dense_r, bm25_r = [], []
    for conv in convs:
        qvecs = embedder.encode([q.text for q in conv.questions])
        dense, lexical = baseline_rankings(embedder, conv, qvecs, max(KS))
        for q, d, b in zip(conv.questions, dense, lexical, strict=True):
            dense_r.append(recall([[i] for i in d], q.gold, 10, to_gold))
            bm25_r.append(recall([[i] for i in b], q.gold, 10, to_gold))
    return {
        "baseline_dense_recall@10": float(np.mean(dense_r)),
        "baseline_bm25_recall@10": float(np.mean(bm25_r)),
    }


def _parse(argv: list[str]) -> tuple[argparse.Namespace, MemoryConfig]:
    p = argparse.ArgumentParser(prog="memrl bench memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=sorted(DEFAULT_PATHS), default="locomo")
    p.add_argument("--path", help="dataset file (default: ../shared/data/...)")
    p.add_argument("--limit", type=int, help="first N conversations (LoCoMo) / questions (LongMemEval)")
    p.add_argument("--categories", default="1,2,3,4", help="LoCoMo QA categories to score")
    p.add_argument("--repeats", type=int, default=1, help="timing repeats for the ingest ratio (min taken)")
    p.add_argument("--no-baselines", action="store_true", help="skip the raw-turn baselines")
    p.add_argument("overrides", nargs="*", help="MemoryConfig key=value overrides")
    args = p.parse_args(argv)
    fields = {f.name: f for f in dataclasses.fields(MemoryConfig)}
    kwargs = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or key not in fields:
            p.error(f"override {item!r}: expected key=value with key in {sorted(fields)}")
        default = fields[key].default
        kwargs[key] = type(default)(value) if default is not None and not isinstance(default, bool) else value
        if isinstance(default, bool):
            kwargs[key] = value.lower() in ("1", "true", "yes")
    return args, MemoryConfig(**kwargs)


@BENCHES.register("memory")
def bench_memory(argv: list[str]) -> dict:
    args, cfg = _parse(argv)
    path = args.path or str(DEFAULT_PATHS[args.dataset])
    convs = load_conversations(args.dataset, path, {int(c) for c in args.categories.split(",")}, args.limit)
    if not convs:
        raise ValueError(f"{path}: no questions with gold evidence (dataset {args.dataset})")
    to_gold = _locomo_ids if args.dataset == "locomo" else _session_ids
    embedder = build_embedder(cfg)
    # Warm up on real texts (thread pools, allocator). Ingest runs first in each repeat, so any remaining
    # warm-up advantage goes to the bare encode: the ratio errs on the conservative side.
    embedder.encode([t.text for t in convs[0].turns[:128]])
    ingest_s, bare_s = [], []
    system = None
    for _ in range(max(1, args.repeats)):
        system = MemorySystem(cfg, embedder=embedder)
        ingest_s.append(ingest(system, convs))
        bare_s.append(_timed_encode(embedder, system.embedding_texts([t for c in convs for t in c.turns])))
    assert system is not None
    # Throughput ratio = bare time / ingest time for the same texts. The CPU-time ratio is the headline: on a
    # shared machine wall time mostly measures the neighbours; both are reported.
    wall_i, cpu_i = min(w for w, _ in ingest_s), min(c for _, c in ingest_s)
    wall_b, cpu_b = min(w for w, _ in bare_s), min(c for _, c in bare_s)
    result = {
        "dataset": args.dataset,
        "conversations": len(convs),
        "questions": sum(len(c.questions) for c in convs),
        "facts": sum(len(system.manager(c.key).facts()) for c in convs),
        "ingest_seconds": round(wall_i, 3),
        "bare_encode_seconds": round(wall_b, 3),
        "ingest_cpu_seconds": round(cpu_i, 3),
        "bare_encode_cpu_seconds": round(cpu_b, 3),
        "ingest_ratio": cpu_b / cpu_i,
        "ingest_ratio_wall": wall_b / wall_i,
        "embedder_dtype": getattr(embedder, "dtype", "float32"),  # as resolved (the config may say auto)
        "config": dataclasses.asdict(cfg),
        **evaluate(system, convs, to_gold),
    }
    if not args.no_baselines:
        result.update(evaluate_baselines(embedder, convs, to_gold))
    return result
