"""The policy writes its own memory (``memory.extractor: policy``), as Memory-R1's memory manager and Mem-α do.

On each write (one history turn, or ``episode.ingest_chunk_turns`` turns) the policy reads, in its own chat
template, the instructions (``memrl/prompts/memory_write.j2``), the nearest *current* facts of its episode shown
with small local ids, and the new turn(s); it answers with one operation per line::

    ADD Mia lives in Rome.
    UPDATE 0 Mia lives in Rome.
    DELETE 1
    NOOP

The memory state lives in the store, outside the tokens. A write is a trainable step: its prompt ids, the
sampled response ids (mask 1) and their rollout log-probs are kept (:class:`WriteSample`), and
:class:`~memrl.memory.manager.MemorySystem.write_batch` generates every episode's write of a batch in one
``generate`` call. A line that is not a valid operation (an unknown op word, an id that was not shown, an
UPDATE/ADD without text) becomes a NOOP whose reason is logged, and counts against the step's format term
(:mod:`memrl.episode.credit`); a reply never crashes a run. An UPDATE *supersedes* the fact it names: the old
fact stays in the store as history with the date it stopped being true, and the new value is a fact of its own
(``FactDecision.supersede``), so "where did I live before?" stays answerable while retrieval prefers the
current value (:func:`memrl.memory.superseded.supersede_rescore`).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from memrl.memory.config import MemoryConfig
from memrl.memory.extract import ExtractionRequest, FactDecision, TextGenerator, turn_caption
from memrl.memory.store import FactRecord
from memrl.memory.write_cache import Reply, WriteCache
from memrl.paths import cache_dir
from memrl.policy.base import MEMORY_ADAPTER, Capability, capabilities, role_scope
from memrl.templates import encode_chat, load_template
from memrl.types import MemoryOpType, TurnSpec

logger = logging.getLogger(__name__)

_LINE = re.compile(r"^[-*\s]*(?P<op>[A-Za-z]+)\b[\s:.-]*(?P<rest>.*)$")
_ID = re.compile(r"^\[?(?P<id>\d+)\]?[\s:.-]*(?P<text>.*)$")
# At most this many operations per write: a small model that loops would otherwise fill the store.
MAX_OPS = 8
FORMAT_REASON = "invalid memory operation"  # the NOOP reason prefix of a line that is not a valid operation


@dataclass(frozen=True)
class ParsedOps:
    """A reply read as operations: ``decisions`` (invalid lines became NOOPs) and one error per invalid line."""

    decisions: tuple[FactDecision, ...]
    errors: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return not self.errors


def _invalid(errors: list[str], why: str) -> FactDecision:
    errors.append(why)
    return FactDecision(MemoryOpType.NOOP, reason=f"{FORMAT_REASON}: {why}")


def _parse_line(line: str, neighbours: Sequence[FactRecord], errors: list[str]) -> FactDecision:
    m = _LINE.match(line)
    word = m["op"].upper() if m else ""
    if word not in ("ADD", "UPDATE", "DELETE", "NOOP"):
        return _invalid(errors, f"{line[:60]!r} does not start with ADD/UPDATE/DELETE/NOOP")
    op, rest = MemoryOpType(word), m["rest"].strip()
    if op is MemoryOpType.NOOP:
        return FactDecision(op, reason="the writer chose NOOP")
    if op is MemoryOpType.ADD:
        if not rest:
            return _invalid(errors, "ADD without a fact")
        return FactDecision(op, text=rest)
    idm = _ID.match(rest)
    if not idm:
        return _invalid(errors, f"{word} needs a shown id, got {rest[:40]!r}")
    local, text = int(idm["id"]), idm["text"].strip()
    if local >= len(neighbours):
        return _invalid(errors, f"{word} id {local} is not one of the shown ids 0..{len(neighbours) - 1}")
    if op is MemoryOpType.UPDATE and not text:
        return _invalid(errors, "UPDATE without the new fact")
    fid = neighbours[local].fact_id
    return FactDecision(op, text=text, fact_id=fid, supersede=op is MemoryOpType.UPDATE)


def parse_ops(reply: str, neighbours: Sequence[FactRecord]) -> ParsedOps:
    """One decision per non-empty line of ``reply`` (at most :data:`MAX_OPS`; more is a format error).

    Written facts are attributed to no speaker: the writer names each fact's subject ("Omar lives in Nairobi."),
    and labelling it with whoever said it ("Dario: Omar lives in Nairobi.") made the answerer read it as
    Dario's, and the retrieval's speaker prior rank it for questions about Dario. Where a fact came from stays
    in its ``source_ids`` and the op log."""
    lines = [ln.strip() for ln in (reply or "").splitlines() if ln.strip()]
    errors: list[str] = []
    if not lines:
        return ParsedOps((_invalid(errors, "empty reply"),), tuple(errors))
    # A small model that loops repeats its last line until the token cap: a repeated write is an error, not a new
    # fact (NOOP lines repeat rightly, one per turn with nothing to remember).
    seen: set[str] = set()
    unique = [ln for ln in lines if ln.upper().startswith("NOOP") or not (ln in seen or seen.add(ln))]
    if len(unique) < len(lines):
        errors.append(f"{len(lines) - len(unique)} repeated line(s) ignored")
    if len(unique) > MAX_OPS:
        errors.append(f"{len(unique)} operations, more than {MAX_OPS}: the rest were ignored")
    decisions = tuple(_parse_line(ln, neighbours, errors) for ln in unique[:MAX_OPS])
    return ParsedOps(decisions, tuple(errors))


@dataclass(frozen=True)
class WriteRequest:
    """One write: the new turn(s) of one episode and the current facts shown to the writer (local id = index)."""

    turns: tuple[TurnSpec, ...]
    neighbours: tuple[FactRecord, ...] = ()


def chunk_end(length: int, cursor: int, chunk: int) -> int:
    """Where the write that starts at turn ``cursor`` of a ``length``-turn history stops: ``chunk`` turns on
    (``episode.ingest_chunk_turns``), or the whole rest when ``chunk`` <= 0."""
    return length if chunk <= 0 else min(length, cursor + chunk)


@dataclass(frozen=True)
class WriteSample:
    """One sampled reply: response ids (all trainable), their rollout log-probs, the text and its operations."""

    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    text: str
    ops: ParsedOps
    # What reaches the store where it differs from what was written (memrl.memory.write_target); None: the same.
    resolved: tuple[FactDecision, ...] | None = None

    @property
    def applied(self) -> tuple[FactDecision, ...]:
        return self.ops.decisions if self.resolved is None else self.resolved


def turn_line(turn: TurnSpec) -> str:
    caption = turn_caption(turn)
    photo = f" [shares a photo: {caption}]" if caption else ""
    who = f"{turn.speaker}: " if turn.speaker else ""
    return f"[{turn.timestamp or 'undated'}] {who}{turn.text.strip()}{photo}"


def render_user(req: WriteRequest) -> str:
    """The user message of a write: what the writer reads besides its instructions."""
    facts = [f"{i}. [{f.timestamp or 'undated'}] {f.text}" for i, f in enumerate(req.neighbours)]
    return "\n".join(["Memory:", *(facts or ["(empty)"]), "New:", *map(turn_line, req.turns), "Operations:"])


WRITER_ADAPTER = MEMORY_ADAPTER  # the LoRA adapter a per-role run trains for writes


class PolicyWriter:
    """The ``policy`` extractor: the policy client writes memory operations (see the module docstring).

    A method whose writer reads or writes differently (MemAgent's overwritten memory text,
    :mod:`memrl.methods.memagent`) subclasses it and changes ``write_template`` (its system message),
    :meth:`render_user` (what it reads) and :meth:`parse` (how its reply becomes decisions on the store); the
    sampling, caching, step recording and credit stay this class's."""

    needs_neighbours = True
    writes_steps = True  # the runner records each write as a trainable step (MemorySystem.write_batch)
    write_template = "memory_write.j2"

    def __init__(self, cfg: MemoryConfig, generate_text: TextGenerator | None = None) -> None:
        client = getattr(generate_text, "client", None)
        if client is None:
            raise ValueError(
                "memory.extractor=policy needs the policy client: MemorySystem(cfg, generate_text="
                "policy_text_generator(client)) (memrl.memory.llm), as build_runner does"
            )
        self.client = client
        self.tokenizer = client.tokenizer
        self.system = load_template(self.write_template).render().strip()
        self.max_tokens = cfg.write_max_tokens
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self.stop_ids = () if eos is None else (int(eos),)
        self.cache_root = cache_dir() if cfg.write_cache else None
        self._write_cache: WriteCache | None = None
        self.cache_hits = 0  # greedy replies read from the write cache since creation
        self.draft_hits = 0  # greedy replies that were another writer's checked drafts (not decoded)

    def render_user(self, req: WriteRequest) -> str:
        return render_user(req)

    def parse(self, reply: str, neighbours: Sequence[FactRecord]) -> ParsedOps:
        return parse_ops(reply, neighbours)

    def prompt_ids(self, req: WriteRequest) -> tuple[int, ...]:
        messages = [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.render_user(req)},
        ]
        return tuple(encode_chat(self.tokenizer, messages))

    def _check_fits(self, requests: Sequence[WriteRequest], prompts: Sequence[tuple[int, ...]]) -> None:
        """A write whose prompt fills the model's window would be aborted by the backend and leave the memory
        empty without a word: LoCoMo with the default ``episode.ingest_chunk_turns: 0`` hands the writer a
        whole ~20 K-token conversation. That is a setting to change, so it stops the run."""
        limit = getattr(self.client, "max_model_len", None)
        if limit is None:
            return
        for req, p in zip(requests, prompts, strict=True):
            if len(p) >= limit:  # the backends abort a prompt that leaves no room for one token
                first, last = req.turns[0].turn_id, req.turns[-1].turn_id
                raise ValueError(
                    f"memory write of {len(req.turns)} turn(s) ({first} .. {last}) is a {len(p)}-token prompt, "
                    f"over policy.max_model_len={limit}: write in chunks that fit, episode.ingest_chunk_turns=N "
                    f"(turns per write; 0 writes the whole history at once)"
                )

    def sample(
        self,
        requests: Sequence[WriteRequest],
        n: Sequence[int],
        temperature: float,
        seed: int | None = None,
        greedy_first: bool = False,
    ) -> tuple[list[tuple[int, ...]], list[list[WriteSample]]]:
        """``n[i]`` replies to request i; returns (prompt ids, samples). With ``greedy_first`` reply 0 is the greedy
        one and only the other ``n[i] - 1`` are sampled (one ``generate`` call for all sampled replies). Greedy
        replies come from the write cache, or from another writer's reply checked as this one's
        (:mod:`memrl.memory.write_cache`), where they can."""
        if not requests:
            return [], []
        prompts = [self.prompt_ids(r) for r in requests]
        self._check_fits(requests, prompts)
        if temperature == 0.0 and all(k == 1 for k in n):
            greedy_first, n = True, [0] * len(n)
        elif greedy_first:
            n = [k - 1 for k in n]
        replies: list[list[Reply]] = [[r] for r in self._greedy(prompts)] if greedy_first else [[] for _ in n]
        todo = [i for i, k in enumerate(n) if k > 0]
        for i, outs in zip(
            todo,
            self._generate([prompts[i] for i in todo], [n[i] for i in todo], temperature, seed),
            strict=True,
        ):
            replies[i].extend((tuple(o.token_ids), tuple(o.logprobs)) for o in outs)
        out = []
        for req, got in zip(requests, replies, strict=True):
            samples = []
            for ids, lps in got:
                text = self.tokenizer.decode(list(ids), skip_special_tokens=True)
                samples.append(WriteSample(ids, lps, text, self.parse(text, req.neighbours)))
            out.append(samples)
        return prompts, out

    def _greedy(self, prompts: Sequence[tuple[int, ...]]) -> list[Reply]:
        """One greedy reply per prompt: cached, else a checked draft, else decoded (once per distinct prompt: the
        questions of one conversation write the same turns over the same memory until their writes differ). A
        rejected draft is decoded from its first differing token on, not from its start."""
        cache = self._cache()
        if cache is None:
            return [
                (tuple(o[0].token_ids), tuple(o[0].logprobs))
                for o in self._generate(prompts, [1] * len(prompts), 0.0, None)
            ]
        unique = list(dict.fromkeys(prompts))
        found = cache.get(unique)
        self.cache_hits += len(found)
        missed = [i for i in range(len(unique)) if i not in found]
        heads = self._checked_drafts(cache, [unique[i] for i in missed])
        new = {missed[j]: head for j, (head, done) in heads.items() if done}
        self.draft_hits += len(new)
        todo = [i for j, i in enumerate(missed) if j not in heads or not heads[j][1]]
        start = {i: heads[j][0] for j, i in enumerate(missed) if j in heads and not heads[j][1]}
        empty: Reply = ((), ())
        head = [start.get(i, empty) for i in todo]
        outs = self._generate([unique[i] + h[0] for i, h in zip(todo, head, strict=True)], [1] * len(todo), 0.0,
                              None, [self.max_tokens - len(h[0]) for h in head])  # fmt: skip
        for i, h, o in zip(todo, head, outs, strict=True):
            new[i] = (h[0] + tuple(o[0].token_ids), h[1] + tuple(o[0].logprobs))
        if new:
            cache.put([unique[i] for i in new], list(new.values()))
        if found:  # the drafts hold what the last writer wrote, from its cache or not
            cache.set_drafts([unique[i] for i in found], list(found.values()))
        found.update(new)
        by_prompt = {unique[i]: reply for i, reply in found.items()}
        return [by_prompt[p] for p in prompts]

    def _checked_drafts(
        self, cache: WriteCache, prompts: Sequence[tuple[int, ...]]
    ) -> dict[int, tuple[Reply, bool]]:
        """Each prompt's draft checked in one forward (module docstring of :mod:`memrl.memory.write_cache`), by
        index: (this writer's greedy reply as far as the forward tells it, whether that is the whole reply). The
        reply runs up to and including the first token where the draft and this writer's argmax differ (the
        argmax there); it is whole where the draft is this writer's greedy reply or the argmax ends it."""
        check = Capability.DRAFT_CHECK in capabilities(self.client)
        drafts = cache.drafts(prompts) if prompts and check else {}
        drafts = {i: ids for i, (ids, _) in drafts.items() if cache.greedy_ending(ids)}
        if not drafts:
            return {}
        with role_scope(self.client, WRITER_ADAPTER):
            scored = self.client.greedy_logprobs([(prompts[i], ids) for i, ids in drafts.items()])
        out = {}
        for (i, ids), (lps, greedy, greedy_lps) in zip(drafts.items(), scored, strict=True):
            j = next((k for k, (a, b) in enumerate(zip(ids, greedy, strict=True)) if a != b), len(ids))
            if j == len(ids):
                out[i] = ((tuple(ids), tuple(lps)), True)
                continue
            head = (tuple(ids[:j]) + (greedy[j],), tuple(lps[:j]) + (greedy_lps[j],))
            out[i] = (head, cache.greedy_ending(head[0]))
        return out

    def _generate(
        self,
        prompts: Sequence[tuple[int, ...]],
        n: Sequence[int],
        temperature: float,
        seed: int | None,
        max_tokens: Sequence[int] | None = None,
    ):
        from memrl.policy.base import GenerationRequest, SamplingParams

        if not prompts:
            return []
        budgets = max_tokens or [self.max_tokens] * len(prompts)
        gens = [
            GenerationRequest(
                p,
                SamplingParams(
                    temperature=temperature, max_tokens=m, n=k, seed=seed, stop_token_ids=self.stop_ids,
                ),
            )
            for p, k, m in zip(prompts, n, budgets, strict=True)
        ]  # fmt: skip
        with role_scope(self.client, WRITER_ADAPTER):  # the writer's own adapter where the policy has one
            outputs = self.client.generate(gens)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"policy returned {len(outputs)} results for {len(prompts)} memory writes")
        return outputs

    def _cache(self) -> WriteCache | None:
        """The cache of the writer's current weights (None: caching off, or a backend without local weights)."""
        if self.cache_root is None:
            return None
        if Capability.WEIGHT_DIGEST not in capabilities(self.client):
            return None
        digest = self.client.weights_digest(WRITER_ADAPTER)
        if digest is None:
            return None
        if self._write_cache is None or self._write_cache.digest != digest:
            if self._write_cache is not None:
                self._write_cache.close()
            self._write_cache = WriteCache(self.cache_root, digest, self.max_tokens, self.stop_ids)
        return self._write_cache

    def forced(
        self, requests: Sequence[WriteRequest], replies: Sequence[str]
    ) -> tuple[list[tuple[int, ...]], list[list[WriteSample]]]:
        """Teacher forcing: ``replies[i]`` is request i's reply (a demonstration, e.g. the gold operations),
        tokenized as the policy would write it and ended with eos; nothing sampled it, so its log-probs are NaN."""
        prompts, out = [self.prompt_ids(r) for r in requests], []
        for req, text in zip(requests, replies, strict=True):
            ids = (*self.tokenizer(text, add_special_tokens=False)["input_ids"], *self.stop_ids)
            out.append([WriteSample(ids, (math.nan,) * len(ids), text, self.parse(text, req.neighbours))])
        return prompts, out

    def extract(self, requests: Sequence[ExtractionRequest]) -> list[list[FactDecision]]:
        """The plain extractor interface (no step recorded): one greedy write per turn."""
        _, samples = self.sample(
            [WriteRequest((r.turn,), r.neighbours) for r in requests], [1] * len(requests), 0.0
        )
        for r, s in zip(requests, samples, strict=True):
            if s[0].ops.errors:
                logger.debug("policy writer, turn %s: %s", r.turn.turn_id, "; ".join(s[0].ops.errors))
        return [list(s[0].ops.decisions) for s in samples]
