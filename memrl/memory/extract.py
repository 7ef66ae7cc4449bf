"""Fact extraction from history turns: the extractor contract (one batched signature), rule and llm extractors.

An extractor turns a batch of :class:`ExtractionRequest` (a turn plus, for extractors that ask for them, the
most similar existing facts of that episode) into per-request :class:`FactDecision` lists — mem0 / Memory-R1
style ``ADD`` / ``UPDATE`` / ``DELETE`` / ``NOOP``. The :class:`~memrl.memory.manager.MemorySystem` embeds,
applies the decisions to the store and logs one ``MemoryOp`` per decision.

Rule facts (the default, no LLM) are speaker-attributed: ``"{speaker}: {text}"`` with an image caption appended
as ``" [shares a photo: {caption}]"``; the turn's date is kept in ``FactRecord.timestamp`` and its dialog id in
``source_ids``. The target-turn prompt renders them as ``- [{timestamp}] {text} ({source_ids})``.

``memory.extractor`` names one in :data:`memrl.memory.extractors.EXTRACTORS` (this module's two, the gold one of
:mod:`memrl.memory.gold` and the policy writer of :mod:`memrl.memory.writer`).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from memrl.memory.config import MemoryConfig
from memrl.memory.store import FactRecord
from memrl.templates import load_template
from memrl.types import MemoryOpType, TurnSpec

logger = logging.getLogger(__name__)

TextGenerator = Callable[[list[str]], list[str]]
"""Batched text completion: prompts → one completion each (see :func:`memrl.memory.llm.policy_text_generator`)."""

# Keys adapters use for an image description attached to a turn (LoCoMo: blip_caption).
CAPTION_KEYS = ("blip_caption", "image_caption", "caption")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'])")


@dataclass(frozen=True)
class ExtractionRequest:
    turn: TurnSpec
    neighbours: tuple[FactRecord, ...] = ()


@dataclass(frozen=True)
class FactDecision:
    """One decision. ``fact_id`` names the fact an UPDATE/DELETE touches; ``reason`` explains NOOPs.
    ``embed_text`` (default: ``text``) is what gets embedded when it should differ from the stored text.
    ``supersede``: an UPDATE that keeps the old fact as history (marked superseded, with the date it stopped
    being true) and adds the new value as a fact of its own, instead of rewriting the old one in place."""

    op: MemoryOpType
    text: str = ""
    fact_id: int | None = None
    reason: str = ""
    speaker: str = ""
    embed_text: str = ""
    supersede: bool = False
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        op = MemoryOpType(self.op)
        object.__setattr__(self, "op", op)
        if op not in (MemoryOpType.ADD, MemoryOpType.UPDATE, MemoryOpType.DELETE, MemoryOpType.NOOP):
            raise ValueError(f"FactDecision.op: {op.value} is not a fact decision")
        if op in (MemoryOpType.UPDATE, MemoryOpType.DELETE) and self.fact_id is None:
            raise ValueError(f"FactDecision: {op.value} needs fact_id")
        if op in (MemoryOpType.ADD, MemoryOpType.UPDATE) and not self.text.strip():
            raise ValueError(f"FactDecision: {op.value} needs non-empty text")


class FactExtractor(Protocol):
    """Built as ``cls(cfg, generate_text)``; class attributes say what the memory system does around it."""

    needs_neighbours: bool  # ask the system to search similar existing facts first
    writes_steps: bool  # each write is a trainable step (the policy writer: MemorySystem.write_batch)

    def extract(self, requests: Sequence[ExtractionRequest]) -> list[list[FactDecision]]: ...


ExtractorFactory = Callable[[MemoryConfig, "TextGenerator | None"], FactExtractor]


def turn_caption(turn: TurnSpec) -> str:
    for key in CAPTION_KEYS:
        value = turn.metadata.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return ""


def split_sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


def rule_fact_texts(turn: TurnSpec) -> list[str]:
    """Speaker-attributed fact texts of one turn (``[]`` for an empty turn)."""
    prefix = f"{turn.speaker}: " if turn.speaker else ""
    return [prefix + p for p in rule_fact_bodies(turn)]


def rule_fact_bodies(turn: TurnSpec) -> list[str]:
    """The fact of one turn without the speaker prefix (what the rule extractor embeds): the whole turn, its
    photo caption appended (one fact per sentence lost to one per turn on LoCoMo retrieval)."""
    caption = turn_caption(turn)
    body = turn.text.strip()
    photo = f"[shares a photo: {caption}]" if caption else ""
    text = f"{body} {photo}".strip()
    return [text] if text else []


class RuleExtractor:
    """ADD every speaker-attributed piece of a turn; exact duplicates of an existing fact become NOOPs."""

    needs_neighbours = False
    writes_steps = False

    def __init__(self, cfg: MemoryConfig, generate_text: TextGenerator | None = None) -> None:
        del cfg, generate_text  # the rule extractor has no settings

    def extract(self, requests: Sequence[ExtractionRequest]) -> list[list[FactDecision]]:
        out = []
        for req in requests:
            bodies = rule_fact_bodies(req.turn)
            if not bodies:
                out.append([FactDecision(MemoryOpType.NOOP, reason="empty turn: nothing to remember")])
                continue
            prefix = f"{req.turn.speaker}: " if req.turn.speaker else ""
            out.append(
                [
                    FactDecision(
                        MemoryOpType.ADD,
                        text=prefix + b,
                        speaker=req.turn.speaker,
                        embed_text=b,  # the text alone: embedding the speaker prefix did not help retrieval
                    )
                    for b in bodies
                ]
            )
        return out


# ---------------------------------------------------------------------------------------------------------
# LLM extractor (mem0 / Memory-R1 decisions). Existing facts are shown with small local ids (0..m-1) so the
# model never has to copy store ids; ids it invents are rejected as NOOPs with a reason.

_JSON_START = re.compile(r"[\[{]")
MALFORMED_REASON = "malformed llm output"  # the NOOP reason of a reply that cannot be parsed


class LlmOutputError(ValueError):
    """An LLM reply that is not a valid decision list (turned into a logged NOOP by the extractor)."""


def parse_decisions(reply: str, neighbours: Sequence[FactRecord], speaker: str) -> list[FactDecision]:
    """Parse ``[{"op": "ADD"|"UPDATE"|"DELETE"|"NOOP", "id": <local id>, "text": ...}, ...]`` (also accepts
    ``{"operations": [...]}`` / ``{"memory": [...]}`` and ``event`` instead of ``op``). Raises LlmOutputError."""
    data = _first_json(reply or "")
    if isinstance(data, dict):
        data = data.get("operations", data.get("memory", [data]))
    if not isinstance(data, list):
        raise LlmOutputError(f"expected a list of operations, got {type(data).__name__}")
    decisions = []
    for i, item in enumerate(data):
        decisions.append(_parse_item(i, item, neighbours, speaker))
    return decisions or [FactDecision(MemoryOpType.NOOP, reason="llm returned an empty operation list")]


def _first_json(reply: str) -> object:
    """The JSON value that starts at the reply's first ``[`` or ``{``; text after it is ignored, since small
    models go on writing after a complete list (SmolLM2-135M: ``[{"op": "NOOP"}]`` then the prompt again)."""
    match = _JSON_START.search(reply)
    if not match:
        raise LlmOutputError(f"no JSON found in reply {reply[:120]!r}")
    try:
        return json.JSONDecoder().raw_decode(reply, match.start())[0]
    except json.JSONDecodeError as exc:
        raise LlmOutputError(
            f"invalid JSON ({exc.msg} at char {exc.pos}) in {reply[match.start() :][:120]!r}"
        ) from exc


def _parse_item(i: int, item: object, neighbours: Sequence[FactRecord], speaker: str) -> FactDecision:
    if not isinstance(item, dict):
        raise LlmOutputError(f"operation {i} is {type(item).__name__}, expected an object")
    raw_op = str(item.get("op", item.get("event", ""))).upper()
    try:
        op = MemoryOpType(raw_op)
    except ValueError:
        raise LlmOutputError(f"operation {i}: op {raw_op!r} is not ADD/UPDATE/DELETE/NOOP") from None
    text = str(item.get("text", "") or "").strip()
    if op is MemoryOpType.NOOP:
        return FactDecision(op, reason=str(item.get("reason", "llm chose NOOP")))
    if op is MemoryOpType.ADD:
        if not text:
            raise LlmOutputError(f"operation {i}: ADD without text")
        return FactDecision(op, text=text, speaker=speaker)
    if op not in (MemoryOpType.UPDATE, MemoryOpType.DELETE):
        raise LlmOutputError(f"operation {i}: {op.value} is not a fact decision")
    local = item.get("id")
    if not isinstance(local, int) or isinstance(local, bool) or not 0 <= local < len(neighbours):
        raise LlmOutputError(
            f"operation {i}: {op.value} id {local!r} is not one of the shown ids 0..{len(neighbours) - 1}"
        )
    if op is MemoryOpType.UPDATE and not text:
        raise LlmOutputError(f"operation {i}: UPDATE without text")
    return FactDecision(op, text=text, fact_id=neighbours[local].fact_id, speaker=speaker)


class LlmExtractor:
    """Prompts ``memrl/prompts/memory_extract.j2`` for all turns of a batch in one ``generate_text`` call."""

    needs_neighbours = True
    writes_steps = False

    def __init__(self, cfg: MemoryConfig, generate_text: TextGenerator | None = None) -> None:
        if generate_text is None:
            raise ValueError(
                "memory.extractor=llm needs a text generator: MemorySystem(cfg, generate_text="
                "policy_text_generator(policy_client)) (memrl.memory.llm)"
            )
        self.template = load_template("memory_extract.j2")
        self.generate_text = generate_text

    def render(self, req: ExtractionRequest) -> str:
        return self.template.render(
            turn=req.turn,
            caption=turn_caption(req.turn),
            facts=[{"id": i, "text": f.text, "timestamp": f.timestamp} for i, f in enumerate(req.neighbours)],
        )

    def extract(self, requests: Sequence[ExtractionRequest]) -> list[list[FactDecision]]:
        if not requests:
            return []
        replies = self.generate_text([self.render(r) for r in requests])
        if len(replies) != len(requests):
            raise RuntimeError(f"text generator returned {len(replies)} replies for {len(requests)} prompts")
        out = []
        for req, reply in zip(requests, replies, strict=True):
            try:
                out.append(parse_decisions(reply, req.neighbours, req.turn.speaker))
            except LlmOutputError as exc:
                logger.warning("llm extractor, turn %s: malformed reply → NOOP (%s)", req.turn.turn_id, exc)
                out.append([FactDecision(MemoryOpType.NOOP, reason=f"{MALFORMED_REASON}: {exc}")])
        return out
