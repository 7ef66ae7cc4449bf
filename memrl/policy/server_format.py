"""Generation outputs in OpenAI's response shapes: completion and chat choices, their logprobs, and the
server-sent-event chunks of ``stream=true`` (``text_completion`` and ``chat.completion.chunk`` objects, then
``data: [DONE]``).

A streamed answer's text deltas join to exactly the text the same request gets without streaming: a token that
ends inside a multi-byte character waits for the rest of it, and a stop string the answer must not show is cut
from the deltas as from the whole text.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.types import FinishReason, GenerationOutput


def answer_text(tokenizer: Any, out: GenerationOutput, include_stop_str: bool) -> str:
    """The generated text; OpenAI leaves out the stop string that ended it unless asked to include it."""
    text = tokenizer.decode(list(out.token_ids), skip_special_tokens=True)
    stop = out.stop_reason
    if not include_stop_str and out.finish_reason is FinishReason.STOP and isinstance(stop, str) and stop:
        cut = text.rfind(stop)
        if cut >= 0:
            text = text[:cut]
    return text


def text_deltas(tokenizer: Any, ids: Sequence[int], text: str) -> list[str]:
    """One delta per token of ``ids``, joining to ``text`` (the answer's final text)."""
    deltas, sent = [], 0
    for i in range(1, len(ids) + 1):
        partial = tokenizer.decode(list(ids[:i]), skip_special_tokens=True)
        upto = sent
        # A half-decoded character shows as U+FFFD until its last byte arrives; a prefix decoding that is not
        # a prefix of the whole (tokenizers that merge across tokens) waits too.
        if not partial.endswith("\ufffd") and text.startswith(partial[: len(text)]):
            upto = max(sent, min(len(partial), len(text)))
        deltas.append(text[sent:upto])
        sent = upto
    if deltas:
        deltas[-1] += text[sent:]
    return deltas


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


def _entry(tokenizer: Any, tid: int, lp: float) -> dict[str, Any]:
    token = tokenizer.decode([tid])
    return {"token": token, "logprob": lp, "bytes": list(token.encode("utf-8"))}


def chat_logprob_entries(tokenizer: Any, out: GenerationOutput, start: int = 0, stop: int | None = None):
    """``choices[i].logprobs.content`` entries for tokens ``start:stop`` of ``out``."""
    ids = out.token_ids[start:stop]
    tops = list(out.top_logprobs[start:stop]) or [{} for _ in ids]
    return [
        {
            **_entry(tokenizer, tid, lp),
            "top_logprobs": [
                _entry(tokenizer, t, v) for t, v in sorted(top.items(), key=lambda kv: kv[1], reverse=True)
            ],
        }
        for tid, lp, top in zip(ids, out.logprobs[start:stop], tops, strict=True)
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
    """One choice to send: its index, the backend's output and its final text."""

    index: int
    out: GenerationOutput
    text: str


def completion_chunks(
    reply: Reply, tokenizer: Any, answers: Sequence[Answer], logprobs: int | None, as_ids: bool
) -> Iterator[dict[str, Any]]:
    """``text_completion`` chunks, one per token of each answer; the last one carries the finish reason."""
    for a in answers:
        ids = list(a.out.token_ids)
        deltas = text_deltas(tokenizer, ids, a.text) or [""]
        tops = list(a.out.top_logprobs) or [{} for _ in ids]
        for i, delta in enumerate(deltas):
            last = i == len(deltas) - 1
            lp = None
            if logprobs is not None and ids:
                lp = completion_logprobs(
                    tokenizer, ids[i : i + 1], a.out.logprobs[i : i + 1], tops[i : i + 1], as_ids
                )
            choice = {
                "index": a.index,
                "text": delta,
                "logprobs": lp,
                "finish_reason": a.out.finish_reason.value if last else None,
                "stop_reason": a.out.stop_reason if last else None,
            }
            yield reply.envelope("text_completion", [choice])


def chat_chunks(
    reply: Reply, tokenizer: Any, answers: Sequence[Answer], logprobs: bool
) -> Iterator[dict[str, Any]]:
    """``chat.completion.chunk`` objects: the role first, one content delta per token, then the finish
    reason with an empty delta."""
    obj = "chat.completion.chunk"
    for a in answers:
        yield reply.envelope(
            obj,
            [
                {
                    "index": a.index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        )
        for i, delta in enumerate(text_deltas(tokenizer, list(a.out.token_ids), a.text)):
            lp = (
                {"content": chat_logprob_entries(tokenizer, a.out, i, i + 1), "refusal": None}
                if logprobs
                else None
            )
            yield reply.envelope(
                obj, [{"index": a.index, "delta": {"content": delta}, "logprobs": lp, "finish_reason": None}]
            )
        yield reply.envelope(
            obj,
            [{"index": a.index, "delta": {}, "logprobs": None, "finish_reason": a.out.finish_reason.value}],
        )
