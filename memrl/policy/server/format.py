"""Generation outputs in OpenAI's response shapes: completion and chat choices, their logprobs, and the
server-sent-event chunks of ``stream=true`` (``text_completion`` and ``chat.completion.chunk`` objects, then
``data: [DONE]``), built from :class:`~memrl.policy.server.stream.TokenEvent` so that live decoding and finished
outputs stream alike.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.policy.server.stream import TextStream, TokenEvent
from memrl.types import GenerationOutput


def token_string(tokenizer: Any, tid: int, as_ids: bool = False) -> str:
    return f"token_id:{tid}" if as_ids else tokenizer.decode([tid])


def completion_logprobs(
    tokenizer: Any,
    token_ids: Sequence[int],
    token_lps: Sequence[float | None],
    tops: Sequence[dict[int, float] | None],
    as_ids: bool,
) -> dict[str, Any]:
    """The ``/v1/completions`` logprobs object for ``token_ids`` (``tops[i]`` None: no alternatives there)."""
    return {
        "tokens": [token_string(tokenizer, t, as_ids) for t in token_ids],
        "token_logprobs": list(token_lps),
        "top_logprobs": [
            None if top is None else {token_string(tokenizer, t, as_ids): lp for t, lp in top.items()}
            for top in tops
        ],
        "text_offset": [],
    }


def _byte_level_table() -> dict[str, int]:
    """Byte-level BPE's printable stand-ins (GPT-2, SmolLM2, Llama 3): printable Latin-1 bytes stand for
    themselves, the other bytes for U+0100 onwards in byte order."""
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    table, shifted = {}, 0
    for b in range(256):
        if b in printable:
            table[chr(b)] = b
        else:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


_BYTE_LEVEL = _byte_level_table()


def token_bytes(tokenizer: Any, tid: int, text: str) -> list[int] | None:
    """The token's UTF-8 bytes (OpenAI's ``bytes``). A token holding part of a character decodes to U+FFFD or
    nothing: its bytes come from the vocabulary piece (SentencePiece ``<0xNN>``, byte-level BPE or a byte
    tokenizer's byte), else there are none to give (``None``)."""
    if text and "\ufffd" not in text:
        return list(text.encode("utf-8"))
    piece = tokenizer.convert_ids_to_tokens(tid)
    found = re.fullmatch(r"<0x([0-9A-Fa-f]{2})>", piece or "")
    if found:
        return [int(found.group(1), 16)]
    if piece and all(c in _BYTE_LEVEL for c in piece):
        return [_BYTE_LEVEL[c] for c in piece]
    return None


def _entry(tokenizer: Any, tid: int, lp: float) -> dict[str, Any]:
    token = tokenizer.decode([tid])
    return {"token": token, "logprob": lp, "bytes": token_bytes(tokenizer, tid, token)}


def chat_logprob_entries(
    tokenizer: Any, token_ids: Sequence[int], lps: Sequence[float], tops: Sequence[dict[int, float]]
) -> list[dict[str, Any]]:
    """``choices[i].logprobs.content`` entries: each token, its logprob and its alternatives, most likely first."""
    return [
        {
            **_entry(tokenizer, tid, lp),
            "top_logprobs": [
                _entry(tokenizer, t, v) for t, v in sorted(top.items(), key=lambda kv: kv[1], reverse=True)
            ],
        }
        for tid, lp, top in zip(token_ids, lps, tops, strict=True)
    ]


def usage(prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[GenerationOutput]]) -> dict[str, Any]:
    prompt_tokens = sum(len(p) for p in prompts)
    completion_tokens = sum(len(o.token_ids) for outs in outputs for o in outs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": sum(o.cached_tokens for outs in outputs for o in outs)},
    }


@dataclass
class Reply:
    """What every object of one response shares: its id, creation time and model name."""

    model: str
    prefix: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = self.id or f"{self.prefix}-{uuid.uuid4().hex[:16]}"

    def envelope(self, obj: str, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            **extra,
        }


def sse(chunks: Iterable[dict[str, Any]]) -> Iterator[str]:
    """Server-sent events as OpenAI sends them: one ``data: {json}`` event per chunk, then ``data: [DONE]``."""
    for chunk in chunks:
        yield f"data: {json.dumps(chunk)}\n\n"
    yield "data: [DONE]\n\n"


@dataclass(frozen=True)
class Answer:
    """One choice to send whole: its index, the backend's output and its final text."""

    index: int
    out: GenerationOutput
    text: str


def completion_chunks(
    reply: Reply,
    events: Iterable[TokenEvent],
    texts: Mapping[int, TextStream],
    logprobs: int | None,
    as_ids: bool,
) -> Iterator[dict[str, Any]]:
    """``text_completion`` chunks: one per event (an answer's new tokens); its last carries the finish reason."""
    for ev in events:
        text = texts[ev.index]
        delta = text.push(ev.token_ids) + (text.finish(ev.final) if ev.final is not None else "")
        lp = None
        if logprobs is not None and ev.token_ids:
            lp = completion_logprobs(text.tokenizer, ev.token_ids, ev.logprobs, ev.top_logprobs, as_ids)
        choice = {
            "index": ev.index,
            "text": delta,
            "logprobs": lp,
            "finish_reason": ev.final.finish_reason.value if ev.final is not None else None,
            "stop_reason": ev.final.stop_reason if ev.final is not None else None,
        }
        yield reply.envelope("text_completion", [choice])


def chat_chunks(
    reply: Reply, events: Iterable[TokenEvent], texts: Mapping[int, TextStream], logprobs: bool
) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` objects: every answer's role first, then a content delta per event, then each
    answer's finish reason with an empty delta."""
    obj = "chat.completion.chunk"

    def chunk(index: int, delta: dict, lp: dict | None = None, finish: str | None = None) -> dict[str, Any]:
        return reply.envelope(
            obj, [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}]
        )

    for index in texts:
        yield chunk(index, {"role": "assistant", "content": ""})
    for ev in events:
        text = texts[ev.index]
        delta = text.push(ev.token_ids) + (text.finish(ev.final) if ev.final is not None else "")
        if ev.token_ids or delta:
            lp = None
            if logprobs:
                entries = chat_logprob_entries(text.tokenizer, ev.token_ids, ev.logprobs, ev.top_logprobs)
                lp = {"content": entries, "refusal": None}
            yield chunk(ev.index, {"content": delta}, lp)
        if ev.final is not None:
            yield chunk(ev.index, {}, finish=ev.final.finish_reason.value)
