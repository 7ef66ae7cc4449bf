"""The HF backend's :class:`~memrl.policy.stream.GenerationStream`: one :class:`DecodeLoop` kept across calls.
``HFPolicy.generate`` is a stream run until every request has finished."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from memrl.policy.base import GenerationRequest
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.batching import DecodeBackend, DecodeLoop, DecodeRow
from memrl.types import GenerationOutput


class StreamBackend(DecodeBackend, Protocol):
    """What the stream asks of :class:`memrl.policy.engine.hf.HFPolicy` besides the decode steps."""

    cfg: PolicyConfig

    def _share_prompts(self, requests: Sequence[GenerationRequest]) -> list[int | None]: ...  # see HFPolicy

    def _rows_for(
        self, index: int, req: GenerationRequest, reported: int | None
    ) -> list[DecodeRow]: ...  # one row per sample

    def _release_rows(self, rows: Sequence[DecodeRow]) -> None: ...  # unlock prefixes of unstarted rows


class HFStream:
    """Requests become rows of one continuous-batching loop; :meth:`wait` decodes until a request's rows have
    all finished and hands it back while the other rows stay in the batch (``HFPolicy.stream()``).

    Rows sample from per-row counter streams, so a request's outputs do not depend on which other requests
    shared its batch or when it joined."""

    def __init__(self, policy: StreamBackend) -> None:
        self.policy = policy
        self.loop = DecodeLoop(policy, policy.cfg.max_batch_size)
        self._rows: dict[int, list[DecodeRow]] = {}
        self._left: dict[int, int] = {}
        self._ready: list[int] = []
        self._next = 0

    def add(self, requests: Sequence[GenerationRequest]) -> list[int]:
        reported = self.policy._share_prompts(requests)
        ids, queue = [], []
        for req, cached in zip(requests, reported, strict=True):
            rid = self._next
            self._next += 1
            ids.append(rid)
            rows = self.policy._rows_for(rid, req, cached)
            self._rows[rid] = rows
            pending = [r for r in rows if r.finish is None]
            self._left[rid] = len(pending)
            if not pending:
                self._ready.append(rid)
            queue += pending
        # Longest budget first (a long row admitted last would decode alone at the end), then similar remaining
        # prompt lengths together (less padding per prefill).
        queue.sort(key=lambda r: (-r.budget, len(r.prompt) - r.cached))
        self.loop.add(queue)
        return ids

    def wait(self, on_step: Callable[[], None] | None = None) -> list[tuple[int, list[GenerationOutput]]]:
        """As :meth:`GenerationStream.wait`; ``on_step()`` runs after every decode step, when
        :meth:`so_far` has each unfinished request's newest tokens."""
        if not self._ready and self.loop.busy:
            with torch.inference_mode():
                self.loop.run(pause=self._note, observe=on_step)
        ready, self._ready = self._ready, []
        return [(rid, self._outputs(rid)) for rid in ready]

    def so_far(self, rid: int) -> list[GenerationOutput]:
        """What an unfinished request's samples have generated so far, in sample order (a sample still
        decoding reports ``finish_reason`` ABORT). Requests already handed back by :meth:`wait` have none."""
        return [r.to_output() for r in self._rows.get(rid, [])]

    def close(self) -> None:
        """Forget unfinished rows (their cached prefixes are unlocked)."""
        self.policy._release_rows([r for rows in self._rows.values() for r in rows])
        self.loop = DecodeLoop(self.policy, self.policy.cfg.max_batch_size)
        self._rows, self._left, self._ready = {}, {}, []

    def _note(self, finished: list[DecodeRow]) -> bool:
        for row in finished:
            self._left[row.req] -= 1
            if self._left[row.req] == 0:
                self._ready.append(row.req)
        return bool(self._ready)

    def _outputs(self, rid: int) -> list[GenerationOutput]:
        rows = self._rows.pop(rid)  # in sample order (HFPolicy._rows_for)
        del self._left[rid]
        return [r.to_output() for r in rows]
