"""MemorySystem (shared per batch) and MemoryManager (one per episode) — the episode's memory verbs.

    system = MemorySystem(cfg)                       # ONE embedder + ONE fact store for a batch
    mems = [system.manager(ep.episode_id) for ep in batch]
    system.extract_facts_batch([(m, turn) for m, turn in ...])   # one encode call for all episodes
    system.compress_batch([(m, recent_turns) for m in mems])
    hits = system.retrieve_batch([(m, question) for m in mems], k=10)  # one encode call
    mems[0].memory_ops                               # MemoryOp log → StepMeta.memory_ops
    system.share(mems[0], mems[1])                   # mems[1] gets mems[0]'s memory without re-extracting

Each per-manager verb (``extract_facts``, ``compress_short_term``, ``retrieve``, ``update_memory``) is the
batched call with one item, so single-episode code and batched code share one implementation.

Batch semantics: all turns of one ``extract_facts_batch`` call are decided against the memory as it was at the
start of the call (the llm extractor sees neighbours from before the call); decisions are then applied in
order, and a decision that names a fact deleted earlier in the same call becomes a logged NOOP.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memrl.formats import extract_answer
from memrl.memory.compress import COMPRESSORS, CompressRequest
from memrl.memory.config import MemoryConfig
from memrl.memory.embedder import Embedder, build_embedder, window_chunks
from memrl.memory.extract import ExtractionRequest, FactDecision, RuleExtractor, TextGenerator
from memrl.memory.extractors import EXTRACTORS
from memrl.memory.passages import ContextItem
from memrl.memory.policy_writes import WriteResult, write_batch
from memrl.memory.rescore import Question, rescore
from memrl.memory.retrieval import RETRIEVERS, Query
from memrl.memory.store import CANDIDATE_POOL, FACT_STORES, FactRecord, FactStore, FactStoreError, NewFact
from memrl.types import MemoryOp, MemoryOpType, TurnRole, TurnSpec

logger = logging.getLogger(__name__)

# FactRecord.extra key of a turn memory.keep_turns stored verbatim (not a fact any writer wrote).
VERBATIM = "verbatim"
# Current facts shown per turn to an extractor that needs them and does not set ``neighbour_count``: the llm
# extractor, and the policy writer's plain ``extract`` (MemorySystem.write_batch shows memory.write_neighbours).
EXTRACTOR_NEIGHBOURS = 5


@dataclass(frozen=True)
class RetrievedFact:
    """A retrieval hit. ``source_ids`` are dialog ids (with neighbour expansion: of the whole window)."""

    fact_id: int
    text: str
    speaker: str
    timestamp: str | None
    source_ids: tuple[str, ...]
    score: float

    @classmethod
    def of(cls, item: ContextItem) -> RetrievedFact:
        """A retrieved window or passage, named by its lead fact."""
        lead = item.lead
        return cls(lead.fact_id, item.text, lead.speaker, lead.timestamp, item.source_ids, item.score)


def renamed(ops: Sequence[MemoryOp], ids: dict[int, int]) -> list[MemoryOp]:
    """``ops`` with their fact ids renamed by ``ids`` (a copied namespace's); ids not in it are kept (a fact
    deleted before the copy)."""
    return [
        dataclasses.replace(op, fact_ids=tuple(ids.get(f, f) for f in op.fact_ids)) if op.fact_ids else op
        for op in ops
    ]


def _nth(values: Sequence[Any] | None, i: int) -> Any:
    """``values[i]``, or None when no values were given."""
    return None if values is None else values[i]


class MemoryManager:
    """One episode's view of the shared :class:`MemorySystem` (its own store namespace, summary and op log)."""

    def __init__(self, system: MemorySystem, episode_id: str) -> None:
        self.system = system
        self.episode_id = episode_id
        self.summary = ""
        self.summary_id: int | None = None
        self._ops: list[MemoryOp] = []

    # -- the memory verbs ------------------------------------------------------------------------------
    def extract_facts(self, turn: TurnSpec) -> list[MemoryOp]:
        return self.system.extract_facts_batch([(self, turn)])[0]

    def compress_short_term(self, turns: Sequence[TurnSpec]) -> MemoryOp:
        return self.system.compress_batch([(self, turns)])[0]

    def retrieve(
        self,
        query: str,
        k: int | None = None,
        *,
        turn_id: str = "retrieve",
        asked_at: str | None = None,
        asked_by: str | None = None,
    ) -> list[RetrievedFact]:
        return self.system.retrieve_batch(
            [(self, query)], k, turn_id=turn_id, asked_at=[asked_at], asked_by=[asked_by]
        )[0]

    def update_memory(self, generation_text: str, turn_id: str) -> list[MemoryOp]:
        return self.system.update_memory_batch([(self, generation_text, turn_id)])[0]

    # -- state ----------------------------------------------------------------------------------------
    @property
    def memory_ops(self) -> list[MemoryOp]:
        """Every op this episode logged, in order (copy)."""
        return list(self._ops)

    def ops_since(self, mark: int) -> list[MemoryOp]:
        """Ops logged after ``mark = len(manager.memory_ops)`` (to attach one turn's ops to a step)."""
        return self._ops[mark:]

    def facts(self) -> list[FactRecord]:
        return self.system.store.records(self.episode_id)

    def _log(self, ops: Sequence[MemoryOp]) -> None:
        self._ops.extend(ops)


class MemorySystem:
    """Owns the embedder, the fact store, extractor/compressor/retriever; hands out per-episode managers.

    ``generate_text`` (prompts → completions) is needed only by the ``llm`` extractor/compressor; wrap a
    PolicyClient with :func:`memrl.memory.llm.policy_text_generator`.
    """

    def __init__(
        self,
        cfg: MemoryConfig,
        *,
        embedder: Embedder | None = None,
        store: FactStore | None = None,
        generate_text: TextGenerator | None = None,
    ) -> None:
        self.cfg = cfg
        self.embedder = embedder or build_embedder(cfg)
        self.store = store or FACT_STORES.get(cfg.store)(cfg, self.embedder.dim)
        if self.store.dim != self.embedder.dim:
            raise ValueError(f"fact store dim {self.store.dim} != embedder dim {self.embedder.dim}")
        self.extractor = EXTRACTORS.get(cfg.extractor)(cfg, generate_text)
        self._turn_facts = RuleExtractor(cfg) if cfg.keep_turns and cfg.extractor != "rule" else None
        self.compressor = COMPRESSORS.get(cfg.compressor)(cfg, generate_text, self.embedder.count_tokens)
        self.retriever = RETRIEVERS.get(cfg.retrieval)(cfg)
        self.metrics: Counter[str] = Counter()
        self._managers: dict[str, MemoryManager] = {}
        # namespace -> (token unit, fact id) -> (text, tokens)
        self._lengths: dict[str, dict[tuple[str, int], tuple[str, int]]] = {}
        self._next_summary_id = 1
        self._forks = 0

    def manager(self, episode_id: str) -> MemoryManager:
        if episode_id not in self._managers:
            self._managers[episode_id] = MemoryManager(self, episode_id)
        return self._managers[episode_id]

    def release(self, episode_id: str) -> None:
        """Forget an episode (its facts, summary and log) once its trajectory is built."""
        self._managers.pop(episode_id, None)
        self._lengths.pop(episode_id, None)
        self.store.drop_namespace(episode_id)

    # -- extraction -----------------------------------------------------------------------------------
    def extract_facts_batch(self, items: Sequence[tuple[MemoryManager, TurnSpec]]) -> list[list[MemoryOp]]:
        """Extract and store facts for many (episode, turn) pairs: ≤ 2 encode calls in total (neighbour
        lookup for extractors that want it, then the new/updated fact texts)."""
        if not items:
            return []
        neighbours: list[tuple[FactRecord, ...]] = [() for _ in items]
        # An extractor may say how it looks facts up (the gold one sees what the policy writer would see);
        # neighbours are current facts, nearest first, as the policy writer's are.
        k = getattr(self.extractor, "neighbour_count", EXTRACTOR_NEIGHBOURS)
        if self.extractor.needs_neighbours and k:
            query = getattr(self.extractor, "neighbour_query", None) or (lambda t: t.text)
            qvecs = self.embedder.encode([query(t) for _, t in items])
            for i, (mgr, _) in enumerate(items):
                neighbours[i] = self.current_neighbours(mgr, qvecs[i : i + 1], k)
        requests = [ExtractionRequest(turn, nb) for (_, turn), nb in zip(items, neighbours, strict=True)]
        decisions = self.extractor.extract(requests)
        if len(decisions) != len(items):
            raise RuntimeError(f"extractor returned {len(decisions)} decision lists for {len(items)} turns")
        if self._turn_facts is not None:
            kept = self._kept_turns([turn for _, turn in items])
            decisions = [k + list(d) for k, d in zip(kept, decisions, strict=True)]
        texts = [
            d.embed_text or d.text
            for ds in decisions
            for d in ds
            if d.op in (MemoryOpType.ADD, MemoryOpType.UPDATE)
        ]
        vecs = iter(self.encode_chunked(texts))
        out = []
        for (mgr, turn), ds in zip(items, decisions, strict=True):
            ops = self._apply(mgr, turn, ds, vecs)
            mgr._log(ops)
            out.append(ops)
        return out

    def _apply(
        self,
        mgr: MemoryManager,
        turn: TurnSpec,
        decisions: Sequence[FactDecision],
        vecs,
        sources: tuple[str, ...] | None = None,
    ) -> list[MemoryOp]:
        """Apply one turn's decisions (``sources``: the dialog ids they came from, default the turn's own)."""
        ns = mgr.episode_id
        src = sources or (turn.turn_id,)
        # Vectors ([n_chunks, dim] each) arrive in decision order for ADD/UPDATE decisions (extract_facts_batch).
        dvecs = [next(vecs) if d.op in (MemoryOpType.ADD, MemoryOpType.UPDATE) else None for d in decisions]
        add_idx = [i for i, d in enumerate(decisions) if d.op is MemoryOpType.ADD]
        new = [
            NewFact(
                decisions[i].text,
                decisions[i].speaker,
                turn.timestamp,
                src,
                turn.turn_id,
                extra={VERBATIM: True} if decisions[i].extra.get(VERBATIM) else {},
            )
            for i in add_idx
        ]
        # All ADDs of a turn go to the store in one call (one FAISS add).
        added = dict(
            zip(
                add_idx,
                self.store.add(ns, new, [dvecs[i] for i in add_idx]) if new else [],
                strict=True,
            )
        )
        ops = []
        for i, d in enumerate(decisions):
            ops.append(self._apply_one(ns, turn, d, added.get(i), dvecs[i], src))
            self.metrics[f"memory/{ops[-1].op.value.lower()}"] += 1
        return ops

    def encode_chunked(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One ``[n_chunks, dim]`` array per text: texts longer than the embedder's window are embedded chunk by
        chunk (:func:`~memrl.memory.embedder.window_chunks`), all chunks of all texts in one encode call."""
        pieces = window_chunks(self.embedder, texts)
        flat = self.embedder.encode([p for ps in pieces for p in ps])
        bounds = np.cumsum([0] + [len(ps) for ps in pieces])
        return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def _apply_one(
        self, ns: str, turn: TurnSpec, d: FactDecision, added_id: int | None, vec, src: tuple[str, ...]
    ) -> MemoryOp:
        if d.op is MemoryOpType.ADD:
            return MemoryOp(MemoryOpType.ADD, turn.turn_id, fact_ids=(added_id,), text=d.text, source_ids=src)
        if d.op is MemoryOpType.NOOP:
            return MemoryOp(MemoryOpType.NOOP, turn.turn_id, text=d.reason, source_ids=src)
        try:
            old = self.store.get(ns, d.fact_id)
        except FactStoreError:
            reason = f"{d.op.value} of fact {d.fact_id} skipped: it does not exist (deleted earlier?)"
            logger.warning("episode %s turn %s: %s", ns, turn.turn_id, reason)
            return MemoryOp(MemoryOpType.NOOP, turn.turn_id, text=reason, source_ids=src)
        if d.op is MemoryOpType.DELETE:
            self.store.delete(ns, [d.fact_id])
            return MemoryOp(
                MemoryOpType.DELETE, turn.turn_id, fact_ids=(d.fact_id,), text=old.text, source_ids=src
            )
        if d.supersede:
            return self._supersede(ns, turn, d, old, vec, src)
        sources = tuple(dict.fromkeys(old.source_ids + src))
        self.store.update(
            ns, d.fact_id, d.text, vec, turn.turn_id, timestamp=turn.timestamp, source_ids=sources
        )
        return MemoryOp(
            MemoryOpType.UPDATE, turn.turn_id, fact_ids=(d.fact_id,), text=d.text, source_ids=sources
        )

    def _supersede(
        self, ns: str, turn: TurnSpec, d: FactDecision, old: FactRecord, vec, src: tuple[str, ...]
    ) -> MemoryOp:
        """The new value becomes a fact of its own; the old one stays as history, marked with the date it
        stopped being true and the fact that replaced it (``FactRecord.extra``)."""
        new_id = self.store.add(ns, [NewFact(d.text, d.speaker, turn.timestamp, src, turn.turn_id)], [vec])[0]
        marks = {"superseded_by": new_id, "valid_until": turn.timestamp or turn.turn_id}
        self.store.update(
            ns, old.fact_id, old.text, self.store.chunk_vectors(ns, old.fact_id), turn.turn_id,
            extra={**old.extra, **marks},
        )  # fmt: skip
        return MemoryOp(
            MemoryOpType.UPDATE, turn.turn_id, fact_ids=(old.fact_id, new_id), text=d.text, source_ids=src
        )

    # -- policy-written memory (memrl.memory.policy_writes) -----------------------------------------------
    def write_batch(
        self,
        items: Sequence[tuple[MemoryManager, Sequence[TurnSpec]]],
        n: Sequence[int] | None = None,
        *,
        temperature: float = 0.0,
        seed: int | None = None,
        teacher: Callable[[Any], str] | None = None,
        fork: bool = True,
        greedy_first: bool = False,
    ) -> list[WriteResult]:
        """One policy write per (episode, new turns): :func:`memrl.memory.policy_writes.write_batch`."""
        return write_batch(
            self,
            items,
            n,
            temperature=temperature,
            seed=seed,
            teacher=teacher,
            fork=fork,
            greedy_first=greedy_first,
        )

    def current_neighbours(self, mgr: MemoryManager, vecs, k: int) -> tuple[FactRecord, ...]:
        """The ``k`` current (not superseded) facts nearest to ``vecs[0]``, nearest first. SmolLM2-135M writes
        "UPDATE 0" far more often than any other id; nearest first, fact 0 is usually the one a change replaces
        (listed in the order they were written, far fewer updates hit the right fact: docs/experiments.md)."""
        if k <= 0:
            return ()
        ns = mgr.episode_id
        verbatim = self.cfg.write_neighbours_verbatim
        # Without the kept turns, written facts are few among them: rank every fact, keep the written ones.
        hits = self.store.search(ns, vecs, 3 * k if verbatim else len(self.store.records(ns)))[0]
        recs = (self.store.get(ns, fid) for fid, _ in hits)
        return tuple(r for r in recs if not r.superseded and (verbatim or not r.extra.get(VERBATIM)))[:k]

    def _kept_turns(self, turns: Sequence[TurnSpec]) -> list[list[FactDecision]]:
        """Each turn's verbatim rule facts (``memory.keep_turns``), marked as verbatim."""
        kept = self._turn_facts.extract([ExtractionRequest(t) for t in turns])
        return [[dataclasses.replace(d, extra={**d.extra, VERBATIM: True}) for d in ds] for ds in kept]

    def _keep_turns(self, items: Sequence[tuple[MemoryManager, TurnSpec]]) -> None:
        """Store each turn's verbatim rule facts (``memory.keep_turns``; before its written facts), one encode."""
        kept = self._kept_turns([t for _, t in items])
        vecs = self._decision_vectors([d for ds in kept for d in ds])
        for (mgr, turn), ds in zip(items, kept, strict=True):
            self.apply_decisions(mgr, (turn,), ds, vecs)

    def _decision_vectors(self, decisions: Sequence[FactDecision]):
        """The vectors of the ADD/UPDATE decisions among ``decisions``, in order, from one encode call."""
        texts = [d.embed_text or d.text for d in decisions if d.op in (MemoryOpType.ADD, MemoryOpType.UPDATE)]
        return iter(self.encode_chunked(texts))

    def apply_decisions(
        self, mgr: MemoryManager, turns: Sequence[TurnSpec], decisions: Sequence[FactDecision], vecs=None
    ) -> list[MemoryOp]:
        """Apply decisions about ``turns`` (dated at the last turn) to ``mgr``'s store; logs the ops. ``vecs``:
        an iterator already holding their ADD/UPDATE vectors in order (default: encode them now)."""
        vecs = self._decision_vectors(decisions) if vecs is None else vecs
        ops = self._apply(mgr, turns[-1], decisions, vecs, tuple(t.turn_id for t in turns))
        mgr._log(ops)
        return ops

    def current_facts(self, mgr: MemoryManager) -> list[FactRecord]:
        return [r for r in self.store.records(mgr.episode_id) if not r.superseded]

    def fork(self, mgr: MemoryManager, episode_id: str) -> tuple[MemoryManager, dict[int, int]]:
        """A manager over a copy of ``mgr``'s facts (released with :meth:`release` like any episode), and the
        copy's ``{fact id: fork's fact id}``."""
        ids = self.store.copy_namespace(mgr.episode_id, episode_id)
        return self.manager(episode_id), ids

    # -- compression ----------------------------------------------------------------------------------
    def compress_batch(self, items: Sequence[tuple[MemoryManager, Sequence[TurnSpec]]]) -> list[MemoryOp]:
        if not items:
            return []
        for mgr, turns in items:
            if not turns:
                raise ValueError(f"compress_short_term(episode {mgr.episode_id!r}): needs at least one turn")
        results = self.compressor.compress([CompressRequest(tuple(t), m.summary) for m, t in items])
        ops = []
        for (mgr, turns), res in zip(items, results, strict=True):
            last, src = turns[-1].turn_id, tuple(t.turn_id for t in turns)
            if res.ok:
                mgr.summary, mgr.summary_id = res.summary, self._next_summary_id
                self._next_summary_id += 1
                op = MemoryOp(
                    MemoryOpType.COMPRESS, last, text=res.summary, summary_id=mgr.summary_id, source_ids=src
                )
            else:
                op = MemoryOp(
                    MemoryOpType.NOOP, last, text=f"compression failed: {res.reason}", source_ids=src
                )
            self.metrics[f"memory/{op.op.value.lower()}"] += 1
            mgr._log([op])
            ops.append(op)
        return ops

    # -- retrieval ------------------------------------------------------------------------------------
    def retrieve_batch(
        self,
        items: Sequence[tuple[MemoryManager, str]],
        k: int | None = None,
        *,
        turn_id: str = "retrieve",
        asked_at: Sequence[str | None] | None = None,
        asked_by: Sequence[str | None] | None = None,
        room: Sequence[int | None] | None = None,
        count_tokens: Callable[[str], int] | None = None,
    ) -> list[list[RetrievedFact]]:
        """The context for each (episode, query): ``k`` hits (default ``top_k``) with their neighbours, as
        fixed windows or budgeted passages (:func:`memrl.memory.rescore.rescore`); one encode call for all
        queries. ``asked_at``: each query's date (the adapters' timestamp formats), for questions that say "two
        weeks ago" or "in the past month". ``asked_by``: each query's speaker, whose own facts a first-person
        question is about (:func:`~memrl.memory.passages.question_speakers`). ``room``: each query's token
        budget for the passages (what its prompt has left), counted by ``count_tokens`` (the policy's
        tokenizer; default the embedder's), so that a passage is never chosen only to be cut from the prompt
        whole. Logs ``MemoryOp(RETRIEVE)``."""
        if not items:
            return []
        for name, given in (("asked_at dates", asked_at), ("asked_by speakers", asked_by), ("rooms", room)):
            if given is not None and len(given) != len(items):
                raise ValueError(f"retrieve_batch: {len(given)} {name} for {len(items)} queries")
        k = k or self.cfg.top_k
        vecs = self.embedder.encode([q for _, q in items]) if self.retriever.needs_vectors else None
        out = []
        for i, (mgr, query) in enumerate(items):
            q = Query(mgr.episode_id, query, None if vecs is None else vecs[i])
            ranked = self.retriever.rank(self.store, q, max(k, CANDIDATE_POOL))
            question = Question(query, _nth(asked_at, i), _nth(asked_by, i))
            facts = self.store.records(mgr.episode_id)
            tokens = self._fact_tokens(mgr.episode_id, count_tokens)
            passages = rescore(ranked, facts, question, self.cfg, k=k, tokens=tokens, room=_nth(room, i))
            hits = [RetrievedFact.of(p) for p in passages]
            mgr._log(
                [
                    MemoryOp(
                        MemoryOpType.RETRIEVE,
                        turn_id,
                        fact_ids=tuple(h.fact_id for h in hits),
                        text=query,
                        scores=tuple(h.score for h in hits),
                        source_ids=tuple(s for h in hits for s in h.source_ids),
                    )
                ]
            )
            self.metrics["memory/retrieve"] += 1
            out.append(hits)
        return out

    def _fact_tokens(
        self, namespace: str, count_tokens: Callable[[str], int] | None
    ) -> Callable[[FactRecord], int]:
        """A fact's length as shown, by ``count_tokens`` (default the embedder's), memoised per namespace."""
        lengths = self._lengths.setdefault(namespace, {})
        unit = "embedder" if count_tokens is None else "prompt"
        count = count_tokens or (lambda text: self.embedder.count_tokens([text])[0])

        def tokens(rec: FactRecord) -> int:
            # Memoised per fact, unit and text: an UPDATE keeps the id but changes the text.
            hit = lengths.get((unit, rec.fact_id))
            if hit is None or hit[0] != rec.text:
                hit = lengths[(unit, rec.fact_id)] = (rec.text, count(rec.text))
            return hit[1]

        return tokens

    # -- generation → memory --------------------------------------------------------------------------
    def update_memory_batch(self, items: Sequence[tuple[MemoryManager, str, str]]) -> list[list[MemoryOp]]:
        """Feed each generation's answer (``<answer>`` content, tool segments removed) through the extractor
        as an ``assistant`` turn; an empty answer is a logged NOOP."""
        out: list[list[MemoryOp] | None] = [None] * len(items)
        todo = []
        for i, (mgr, text, turn_id) in enumerate(items):
            answer = extract_answer(text or "")
            if not answer:
                op = MemoryOp(MemoryOpType.NOOP, turn_id, text="generation has no answer text to remember")
                mgr._log([op])
                out[i] = [op]
            else:
                todo.append((i, mgr, TurnSpec(TurnRole.TARGET, answer, turn_id, speaker="assistant")))
        results = self.extract_facts_batch([(m, t) for _, m, t in todo])
        for (i, _, _), ops in zip(todo, results, strict=True):
            out[i] = ops
        return [o or [] for o in out]

    def embedding_texts(self, turns: Sequence[TurnSpec]) -> list[str]:
        """The texts (window chunks) ``extract_facts_batch`` would encode for ``turns`` with an extractor that
        needs no neighbours (rule). Benches use it to time a bare ``encode`` of exactly the same texts."""
        if self.extractor.needs_neighbours:
            raise ValueError("embedding_texts needs an extractor without neighbour lookups (e.g. rule)")
        decisions = self.extractor.extract([ExtractionRequest(t) for t in turns])
        texts = [d.embed_text or d.text for ds in decisions for d in ds if d.op is MemoryOpType.ADD]
        return [p for ps in window_chunks(self.embedder, texts) for p in ps]

    # -- sharing ----------------------------------------------------------------------------------------
    def share(self, source: MemoryManager, target: MemoryManager) -> dict[int, int]:
        """Give ``target`` (an episode with no memory yet) a copy of ``source``'s memory: its facts (new ids,
        same texts, vectors, sources and order), summary and op log, ids renamed. Episodes over the same history
        (the questions of one LoCoMo conversation) then extract it once. Returns ``{source id: target id}``."""
        if target.memory_ops or self.store.records(target.episode_id):
            raise ValueError(f"share: episode {target.episode_id!r} already has memory of its own")
        ids = self.store.copy_namespace(source.episode_id, target.episode_id)
        target.summary, target.summary_id = source.summary, source.summary_id
        target._log(renamed(source.memory_ops, ids))
        return ids

    # -- persistence ----------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        """Persist the fact store atomically (summaries/op logs are per-episode state, not persisted)."""
        self.store.save(path)
