"""Policy-written memory (``memory.extractor: policy``): one write per (episode, new turns), batched.

The writer (:class:`~memrl.memory.writer.PolicyWriter`) reads the new turns and the current facts nearest them and
replies with operations; here its replies meet the store. For each write, ``n`` replies are sampled in one
generate call, every reply's operations are resolved against the facts it was shown
(:mod:`memrl.memory.write_target`), reply 0 is applied to the episode's own store and, for step credit that
scores alternatives (:mod:`memrl.episode.snapshot`), each reply also goes to its own fork of the store, all forks
taken before anything is applied. A :class:`WriteResult` records what the writer read and wrote.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memrl.memory.store import FactRecord
from memrl.memory.write_target import resolve_batch
from memrl.memory.writer import WriteRequest, turn_line
from memrl.types import MemoryOp, TurnSpec

# ``system`` below is the :class:`~memrl.memory.manager.MemorySystem` and ``mgr`` one of its
# :class:`~memrl.memory.manager.MemoryManager` s (typed loosely: the system's module builds on this one).


@dataclass(frozen=True)
class WriteResult:
    """One policy write: what the writer read (``turns``, ``neighbours`` with local id = index, ``prompt_ids``),
    its sampled replies (``samples[0]`` was applied: ``ops``) and the current fact ids before and after."""

    turns: tuple[TurnSpec, ...]
    neighbours: tuple[FactRecord, ...]
    prompt_ids: tuple[int, ...]
    samples: tuple[Any, ...]  # memrl.memory.writer.WriteSample
    ops: tuple[MemoryOp, ...]
    facts_before: tuple[int, ...]
    facts_after: tuple[int, ...]
    alternatives: tuple[str, ...] = ()  # namespaces of the store forks, one per sample (snapshot credit)


def write_batch(
    system: Any,
    items: Sequence[tuple[Any, Sequence[TurnSpec]]],
    n: Sequence[int] | None = None,
    *,
    temperature: float = 0.0,
    seed: int | None = None,
    teacher: Callable[[WriteRequest], str] | None = None,
    fork: bool = True,
    greedy_first: bool = False,
) -> list[WriteResult]:
    """One policy write per (episode manager, new turns): ``n[i]`` replies for item i, reply 0 greedy with
    ``greedy_first``, the others sampled in one generate call. Reply 0 is applied to the episode's store, the
    others are alternatives for step credit, each on its own fork when ``fork``. With ``teacher`` each reply is
    ``teacher(request)`` (a demonstration)."""
    writer = system.extractor
    if not writer.writes_steps:
        raise ValueError(f"memory.extractor={system.cfg.extractor!r} writes no steps; use 'policy'")
    if not items:
        return []
    qvecs = system.embedder.encode(["\n".join(turn_line(t) for t in turns) for _, turns in items])
    requests = [
        WriteRequest(
            tuple(turns), system.current_neighbours(mgr, qvecs[i : i + 1], system.cfg.write_neighbours)
        )
        for i, (mgr, turns) in enumerate(items)
    ]
    if teacher is None:
        prompts, samples = writer.sample(requests, n or [1] * len(items), temperature, seed, greedy_first)
    else:
        prompts, samples = writer.forced(requests, [teacher(r) for r in requests])
    samples = _resolve(system, items, requests, samples)
    if system._turn_facts is not None:
        # after the writer read its neighbours, before its forks are taken: every fork holds them
        system._keep_turns([(mgr, t) for mgr, turns in items for t in turns])
    # One encode call for the facts of every reply that gets applied (forks first, then reply 0, per item).
    vecs = system._decision_vectors([d for ds in _use_order(samples, fork) for d in ds])
    out = []
    for (mgr, turns), req, prompt, alts in zip(items, requests, prompts, samples, strict=True):
        before = tuple(r.fact_id for r in system.current_facts(mgr))
        forks = _fork_alternatives(system, mgr, turns, alts, vecs) if fork and len(alts) > 1 else ()
        ops = system.apply_decisions(mgr, turns, alts[0].applied, vecs)
        after = tuple(r.fact_id for r in system.current_facts(mgr))
        out.append(
            WriteResult(tuple(turns), req.neighbours, prompt, tuple(alts), tuple(ops), before, after, forks)
        )
    return out


def _use_order(samples, fork: bool = True) -> list:
    """The decision lists of a write batch in the order :func:`write_batch` applies them: per item, every fork's
    reply (sampled writes), then reply 0 to the episode's own store."""
    return [
        alt.applied for alts in samples for alt in ((*alts, alts[0]) if fork and len(alts) > 1 else alts[:1])
    ]


def _resolve(system: Any, items, requests, samples) -> list[list[Any]]:
    """Every reply's writes resolved against the facts its write was shown (:mod:`memrl.memory.write_target`)."""
    cfg = system.cfg
    out, counts = resolve_batch(
        [mgr.episode_id for mgr, _ in items], [r.neighbours for r in requests], samples,
        system.encode_chunked, system.store.chunk_vectors,
        target=cfg.update_target, floor=cfg.update_min_cosine, ceiling=cfg.add_supersede_cosine,
    )  # fmt: skip
    system.metrics.update(+counts)
    return out


def _fork_alternatives(system: Any, mgr: Any, turns: Sequence[TurnSpec], alts, vecs) -> tuple[str, ...]:
    """One fork of ``mgr``'s store per reply, all taken before any reply is applied; reply j goes to fork j."""
    forks = []
    for _ in alts:
        system._forks += 1
        forks.append(system.fork(mgr, f"{mgr.episode_id}~fork{system._forks}"))
    for (fork, ids), alt in zip(forks, alts, strict=True):
        # The reply named the episode's fact ids; the fork holds the same facts under its own ids.
        decisions = [
            d if d.fact_id is None else dataclasses.replace(d, fact_id=ids[d.fact_id]) for d in alt.applied
        ]
        system.apply_decisions(fork, turns, decisions, vecs)
    return tuple(fork.episode_id for fork, _ in forks)
