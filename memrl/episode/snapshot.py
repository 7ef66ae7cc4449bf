"""Snapshot credit for memory writes (Memory-R1): ``k`` alternatives from one store state, each scored by answering.

At a planned write, the policy gives ``k`` replies (``episode.memory_credit.snapshot_k``) to the same prompt: its
greedy reply and ``k - 1`` sampled ones. Before anything is applied,
:meth:`~memrl.memory.manager.MemorySystem.write_batch` forks the episode's store once per reply and applies reply
``j`` to fork ``j`` only; the episode's own store gets reply 0, the greedy one. Each fork then
answers the episode's question — retrieval, the target-turn prompt, one greedy answer without tools, the
episode's reward function — and that score is the reply's outcome. The ``k`` replies are one GRPO group
(:func:`memrl.episode.credit.credit_group`), so the advantage compares operations written from the same state.
All forks of a batch's writes are answered in one ``generate`` call and released afterwards.

With ``snapshot_score: gold_logprob`` a fork is not answered: its outcome is how likely the answer policy finds the
gold answer over the fork's prompt (one scoring forward, no decoding). On LoCoMo the greedy answers of a group's
forks tie (docs/internals.md): one write among many rarely turns an answer, while the gold answer's likelihood
moves with every fact that enters or leaves the prompt.

Which questions: the episode's own (``snapshot_questions: own``), or every question of the batch asked over the
same history (``all``; the outcome is their mean; the questions of one LoCoMo conversation share its history). A
planned write reads the question's evidence, where a written fact helps its own question; the other questions
also see what that fact pushes out of their prompts (a prompt holds a fixed budget of facts and turns), so
``all`` prices clutter that ``own`` cannot see.

Which writes: those that read an evidence turn of the question (``metadata["evidence_turn_ids"]``) first, then
others drawn by a hash of the episode id, up to ``snapshot_writes`` per episode; with ``all``, the episodes over
one history share one trunk and its ``snapshot_writes`` groups, every question's evidence writes first. Every
other write is greedy: the episode's store is the memory the writer builds at test (the trunk), and a group's
alternatives are compared inside it, the greedy reply among them. The trunk costs little: the write cache holds
the writer's greedy replies, and a writer changed by an update checks the last step's reply as its own in one
forward (drafts, :mod:`memrl.memory.write_cache`) instead of decoding it. A sampled trunk was decoded anew at every
step, and each group was compared inside a memory the writer would not build.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Sequence
from typing import Protocol

from memrl.episode.config import MemoryCreditConfig
from memrl.episode.prompt import PromptTooLongError
from memrl.episode.state import EpisodeState
from memrl.formats import format_answer
from memrl.memory.manager import MemoryManager, MemorySystem, RetrievedFact
from memrl.memory.policy_writes import WriteResult
from memrl.policy.base import GenerationRequest, PolicyClient, SamplingParams
from memrl.rewards.base import RewardFn, RewardInput
from memrl.types import BatchInput, EpisodeStatus


def _interleave(lists: Sequence[Sequence[int]]) -> list[int]:
    """The first item of each list, then the second of each, and so on."""
    out = []
    for i in range(max((len(x) for x in lists), default=0)):
        out.extend(x[i] for x in lists if i < len(x))
    return out


def history_key(inp: BatchInput) -> tuple:
    """Equal for episodes over the same history (the questions of one LoCoMo conversation)."""
    return tuple((t.turn_id, t.text, t.speaker, t.timestamp) for t in inp.history)


class SnapshotHost(Protocol):
    """What the scorer answers forks with (:class:`~memrl.episode.runner.EpisodeRunner` declares it): the memory
    system (fork managers, ``retrieve_batch``, ``release``), the policy (``generate``, ``logprobs``,
    ``tokenizer``), the reward, and the target-turn prompt of a question."""

    memory: MemorySystem
    policy: PolicyClient
    reward: RewardFn

    @property
    def max_response_tokens(self) -> int: ...

    def memory_room(self, st: EpisodeState) -> int:
        """Policy tokens the retrieved passages of ``st``'s prompt may take."""
        ...

    def prompt_tokens(self, text: str) -> int: ...

    def answer_prompt(self, question: str, facts: Sequence[RetrievedFact]) -> tuple[int, ...]:
        """The target-turn prompt's ids over ``facts`` (raises ``PromptTooLongError``)."""
        ...


class SnapshotScorer:
    def __init__(self, cfg: MemoryCreditConfig, host: SnapshotHost) -> None:
        self.cfg = cfg
        self.host = host
        # id(episode state) -> the states whose questions its forks answer
        self._askers: dict[int, list[EpisodeState]] = {}

    def plan(self, inp: BatchInput, chunk: int) -> set[int]:
        """The write indices of ``inp`` to sample as groups (writes of ``chunk`` turns; 0 = one write)."""
        hits, rest = self._ranked(inp, chunk)
        return set((hits + rest)[: self.cfg.snapshot_writes])

    def _ranked(self, inp: BatchInput, chunk: int) -> tuple[list[int], list[int]]:
        """``inp``'s writes that read an evidence turn of its question, in order, and the others in an order
        drawn from its episode id."""
        history = inp.history
        size = chunk if chunk > 0 else max(1, len(history))
        n_writes = (len(history) + size - 1) // size
        evidence = set(inp.metadata.get("evidence_turn_ids", ()) or ())
        hits = [
            i
            for i in range(n_writes)
            if any(t.turn_id in evidence for t in history[i * size : (i + 1) * size])
        ]
        rest = [i for i in range(n_writes) if i not in hits]
        seed = int(hashlib.sha256(inp.episode_id.encode()).hexdigest()[:8], 16)
        random.Random(seed).shuffle(rest)
        return hits, rest

    def _shared_plan(self, group: Sequence[EpisodeState], chunk: int) -> set[int]:
        """``snapshot_writes`` writes of one trunk shared by ``group``'s questions: every question's evidence
        writes first, taken in turn from each question, then the others in turn."""
        ranked = [self._ranked(st.inp, chunk) for st in group]
        order = _interleave([h for h, _ in ranked]) + _interleave([r for _, r in ranked])
        return set(list(dict.fromkeys(order))[: self.cfg.snapshot_writes])

    def prepare(self, states: Sequence[EpisodeState], chunk: int) -> list[list[EpisodeState]]:
        """Plan each episode's snapshot writes, note which questions its forks answer (its own, or with
        ``snapshot_questions: all`` every episode of the batch over the same history, its own first), and return
        the episodes that write one trunk together, the writer first.

        With ``all``, the episodes over one history build the same greedy trunk and a fork is scored on the same
        questions whichever of them planned it, so the first writes the trunk once and the others copy its
        memory: a LoCoMo step over several questions of one conversation writes the conversation once.
        ``snapshot_writes`` then counts the trunk's groups (:meth:`_shared_plan`). With ``own`` each episode
        writes its own trunk with its own ``snapshot_writes`` groups."""
        by_history: dict[tuple, list[EpisodeState]] = {}
        for st in states:
            by_history.setdefault(history_key(st.inp), []).append(st)
        shared = self.cfg.snapshot_questions == "all"
        self._askers = {}
        for group in by_history.values():
            for st in group:
                others = [o for o in group if o is not st] if shared else []
                self._askers[id(st)] = [st, *others]
        if not shared:
            for st in states:
                st.snapshot_writes = self.plan(st.inp, chunk)
            return [[st] for st in states]
        for group in by_history.values():
            group[0].snapshot_writes = self._shared_plan(group, chunk)
            for st in group[1:]:
                st.snapshot_writes = set()
        return list(by_history.values())

    def score(self, scored: Sequence[tuple[EpisodeState, WriteResult]]) -> None:
        """Answer the questions of :meth:`prepare` on every fork of ``scored`` ((EpisodeState, WriteResult) pairs)
        and record each alternative's reward, the mean over those questions, in
        ``state.snapshot_rewards[write index]``; the forks are released."""
        memory = self.host.memory
        forks = [
            (st, len(st.writes) - 1, memory.manager(ns)) for st, res in scored for ns in res.alternatives
        ]
        try:
            jobs, owner = [], []
            for f, (st, _, mgr) in enumerate(forks):
                # An asker that failed since (a sibling's later phase) has nothing left to ask.
                askers = [
                    a
                    for a in self._askers.get(id(st), [st])
                    if a is st or a.status is not EpisodeStatus.FAILED
                ]
                jobs.extend((a, mgr) for a in askers)
                owner.extend([f] * len(askers))
            rewards = self._answer(jobs)
            per_fork: list[list[float]] = [[] for _ in forks]
            for f, r in zip(owner, rewards, strict=True):
                per_fork[f].append(r)
            for (st, index, _), rs in zip(forks, per_fork, strict=True):
                st.snapshot_rewards.setdefault(index, []).append(sum(rs) / len(rs))
        finally:
            for _, _, mgr in forks:
                memory.release(mgr.episode_id)

    def _answer(self, jobs: Sequence[tuple[EpisodeState, MemoryManager]]) -> list[float]:
        """One outcome per (asking episode, fork manager) job."""
        ids = self._prompts(jobs)
        if self.cfg.snapshot_score == "gold_logprob":
            return self._gold_likelihood(jobs, ids)
        return self._greedy_reward(jobs, ids)

    def _prompts(self, jobs: Sequence[tuple[EpisodeState, MemoryManager]]) -> list[tuple[int, ...] | None]:
        """Each job's target-turn prompt over what its fork retrieves for the asker's question (``None``: too
        long)."""
        host = self.host
        memory = host.memory
        hits = memory.retrieve_batch(
            [(mgr, st.inp.final_query) for st, mgr in jobs],
            memory.cfg.top_k,
            turn_id="snapshot",
            asked_at=[st.inp.target.timestamp for st, _ in jobs],
            asked_by=[st.inp.target.speaker for st, _ in jobs],
            room=[host.memory_room(st) for st, _ in jobs],
            count_tokens=host.prompt_tokens,
        )
        ids: list[tuple[int, ...] | None] = []
        for (st, _), facts in zip(jobs, hits, strict=True):
            try:
                ids.append(host.answer_prompt(st.inp.final_query, facts))
            except PromptTooLongError:
                ids.append(None)
        return ids

    def _greedy_reward(
        self, jobs: Sequence[tuple[EpisodeState, MemoryManager]], ids: list[tuple[int, ...] | None]
    ) -> list[float]:
        policy = self.host.policy
        params = SamplingParams(temperature=0.0, max_tokens=self.host.max_response_tokens)
        todo = [i for i, p in enumerate(ids) if p is not None]
        outs = policy.generate([GenerationRequest(tuple(ids[i]), params) for i in todo]) if todo else []
        texts = [""] * len(jobs)
        for i, out in zip(todo, outs, strict=True):
            texts[i] = policy.tokenizer.decode(list(out[0].token_ids), skip_special_tokens=True)
        inputs = [
            RewardInput.from_response(text, st.inp.target_answer, st.inp.final_query, st.inp.metadata)
            for (st, _), text in zip(jobs, texts, strict=True)
        ]
        return [float(r) for r in self.host.reward(inputs)]

    def _gold_likelihood(
        self, jobs: Sequence[tuple[EpisodeState, MemoryManager]], ids: list[tuple[int, ...] | None]
    ) -> list[float]:
        """exp(mean log p(gold reply token | prompt, earlier tokens)) per fork, the gold reply written as the policy
        answers (``<answer>gold</answer>``, then eos). A fork whose prompt cannot be built, or a question without a
        gold answer, scores 0 (no signal among alternatives that all do)."""
        policy = self.host.policy
        tok = policy.tokenizer
        eos = [] if getattr(tok, "eos_token_id", None) is None else [int(tok.eos_token_id)]
        replies: dict[str, list[int]] = {}  # the k forks of a write share one gold reply: tokenized once
        pairs, where = [], []
        for i, ((st, _), prompt) in enumerate(zip(jobs, ids, strict=True)):
            gold = st.inp.target_answer
            if prompt is None or gold is None:
                continue
            if gold not in replies:
                replies[gold] = [*tok(format_answer(gold), add_special_tokens=False)["input_ids"], *eos]
            pairs.append((prompt, replies[gold]))
            where.append(i)
        # Forks that retrieved the same facts build the same prompt: scored once, so they tie exactly (a padded
        # batch can differ in the last bits between rows, and a std-normalised advantage would blow that up).
        unique = list(dict.fromkeys((tuple(p), tuple(r)) for p, r in pairs))
        lps = dict(zip(unique, policy.logprobs(unique) if unique else [], strict=True))
        scores = [0.0] * len(jobs)
        for i, (p, r) in zip(where, pairs, strict=True):
            got = lps[(tuple(p), tuple(r))]
            scores[i] = math.exp(sum(got) / len(got))
        return scores
