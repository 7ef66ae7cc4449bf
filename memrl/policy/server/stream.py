"""Token events for ``stream=true``: the tokens each answer gained since its last event, as the backend decodes
them (:class:`LiveGeneration`, for backends with a ``stream()`` such as the HF backend) or split from finished
outputs (:func:`events_of`, for any other backend), and the text deltas they make (:class:`TextStream`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from memrl.policy.base import GenerationRequest
from memrl.policy.errors import PolicyError
from memrl.types import FinishReason, GenerationOutput


@dataclass(frozen=True)
class TokenEvent:
    """Answer ``index`` gained ``token_ids`` (with their logprobs and top-k alternatives); ``final`` is its
    output once it has ended (then ``token_ids`` may be empty)."""

    index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_logprobs: tuple[dict[int, float], ...]
    final: GenerationOutput | None = None


def _event(index: int, out: GenerationOutput, start: int, stop: int, final: bool) -> TokenEvent:
    tops = out.top_logprobs[start:stop] if out.top_logprobs else ({},) * (stop - start)
    ids, lps = out.token_ids[start:stop], out.logprobs[start:stop]
    return TokenEvent(index, tuple(ids), tuple(lps), tuple(tops), out if final else None)


def events_of(outputs: Sequence[Sequence[GenerationOutput]], n: int) -> Iterator[TokenEvent]:
    """Finished outputs as one event per token; an answer's last event carries its output."""
    for i, outs in enumerate(outputs):
        for j, out in enumerate(outs):
            size = len(out.token_ids)
            for k in range(max(size, 1)):
                yield _event(i * n + j, out, k, min(k + 1, size), final=k >= size - 1)


class _Cancelled(Exception):
    """The client stopped reading: the decode ends at its next step."""


_END = object()


class LiveGeneration:
    """Decodes ``requests`` on ``policy.stream()`` in a thread (holding ``lock``, which serialises every call
    into the policy) and yields :class:`TokenEvent` after each decode step. A decode failure is raised from
    the iteration; :attr:`outputs` holds every answer once the iteration has ended."""

    def __init__(
        self, policy: Any, requests: Sequence[GenerationRequest], lock: threading.Lock, n: int
    ) -> None:
        self.outputs: list[list[GenerationOutput]] = []
        self._queue: queue.Queue = queue.Queue()
        self._cancel = threading.Event()
        self._thread = threading.Thread(
            target=self._produce,
            args=(policy, list(requests), lock, n),
            name="memrl-serve-stream",
            daemon=True,
        )
        self._thread.start()

    def _produce(self, policy: Any, requests: list[GenerationRequest], lock: threading.Lock, n: int) -> None:
        try:
            with lock:
                stream = policy.stream()
                try:
                    self._decode(stream, requests, n)
                finally:
                    stream.close()
        except Exception as exc:  # handed to the reading side, which reports it to the client
            self._queue.put(exc)
        else:
            self._queue.put(_END)

    def _decode(self, stream: Any, requests: list[GenerationRequest], n: int) -> None:
        ids = stream.add(requests)
        position = {rid: i for i, rid in enumerate(ids)}
        sent: dict[int, int] = {}

        def send(index: int, out: GenerationOutput, final: bool) -> None:
            start = sent.get(index, 0)
            if len(out.token_ids) > start or final:
                self._queue.put(_event(index, out, start, len(out.token_ids), final))
                sent[index] = len(out.token_ids)

        def on_step() -> None:
            if self._cancel.is_set():
                raise _Cancelled
            for rid in ids:
                for j, out in enumerate(stream.so_far(rid)):
                    send(position[rid] * n + j, out, final=False)

        done: dict[int, list[GenerationOutput]] = {}
        while len(done) < len(ids):
            finished = stream.wait(on_step=on_step)
            if not finished:
                raise PolicyError(f"stream: {len(ids) - len(done)} requests never finished")
            for rid, outs in finished:
                done[rid] = outs
                for j, out in enumerate(outs):
                    send(position[rid] * n + j, out, final=True)
        self.outputs = [done[rid] for rid in ids]

    def __iter__(self) -> Iterator[TokenEvent]:
        try:
            while True:
                item = self._queue.get()
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:  # also when the client went away mid-stream
            self._cancel.set()


class TextStream:
    """The text deltas of one answer as its tokens arrive; they join to the answer's final text
    (:func:`answer_text`). A character still missing bytes waits for them, and text that may be the start of a
    stop string waits until the stop fires (and is cut) or can no longer fire there."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], include_stop: bool) -> None:
        self.tokenizer, self.include_stop = tokenizer, include_stop
        self.stops = [s for s in stops if s]
        self.ids: list[int] = []
        self.sent = ""

    def push(self, token_ids: Sequence[int]) -> str:
        self.ids.extend(token_ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        safe = len(text.rstrip("\ufffd"))
        if not self.include_stop:
            safe = min(safe, self._before_stop(text))
        return self._emit(text, safe)

    def finish(self, out: GenerationOutput) -> str:
        text = answer_text(self.tokenizer, out, self.include_stop)
        return self._emit(text, len(text))

    def _before_stop(self, text: str) -> int:
        safe = len(text)
        for stop in self.stops:
            at = text.find(stop)
            if at >= 0:
                safe = min(safe, at)
                continue
            for k in range(min(len(stop) - 1, len(text)), 0, -1):  # a tail that may grow into the stop
                if text.endswith(stop[:k]):
                    safe = min(safe, len(text) - k)
                    break
        return safe

    def _emit(self, text: str, upto: int) -> str:
        if upto <= len(self.sent) or not text.startswith(self.sent):
            return ""
        delta, self.sent = text[len(self.sent) : upto], text[:upto]
        return delta


def answer_text(tokenizer: Any, out: GenerationOutput, include_stop_str: bool) -> str:
    """The generated text; OpenAI leaves out the stop string that ended it unless asked to include it."""
    text = tokenizer.decode(list(out.token_ids), skip_special_tokens=True)
    stop = out.stop_reason
    if not include_stop_str and out.finish_reason is FinishReason.STOP and isinstance(stop, str) and stop:
        cut = text.rfind(stop)
        if cut >= 0:
            text = text[:cut]
    return text
