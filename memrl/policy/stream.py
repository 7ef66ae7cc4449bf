"""Generation streams: requests join and leave one running decode batch, as vLLM's engine serves them.

``policy.generate(requests)`` returns when *every* request has finished, so a caller that reacts to results (a
tree search expanding a tree whose branches have ended) waits for the slowest row of the whole call. A
:class:`GenerationStream` hands back each request as soon as its ``n`` samples have finished, and requests
``add``-ed meanwhile join the rows still decoding::

    stream = open_stream(policy)
    [rid] = stream.add([request])
    for rid, outputs in stream.wait():  # blocks until at least one request has finished
        ...
    stream.close()

Backends with a ``stream()`` method (:class:`memrl.policy.engine.hf.HFPolicy`) decode continuously; any other
:class:`~memrl.policy.base.PolicyClient` gets :class:`BlockingStream`, which runs everything added so far as one
``generate`` call per ``wait`` (the same results, without the overlap).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from memrl.policy.base import GenerationRequest, PolicyClient
from memrl.types import ContractError, GenerationOutput


@runtime_checkable
class GenerationStream(Protocol):
    def add(self, requests: Sequence[GenerationRequest]) -> list[int]:
        """Queue requests; returns their ids (unique within the stream)."""
        ...

    def wait(self) -> list[tuple[int, list[GenerationOutput]]]:
        """Decode until at least one queued request has all its ``params.n`` outputs; returns every request
        finished by then as ``(id, outputs)``. Returns ``[]`` when nothing is queued."""
        ...

    def close(self) -> None:
        """Drop unfinished work and free what the stream holds (its requests' results stay valid)."""
        ...


class BlockingStream:
    """A stream over plain ``generate``: each :meth:`wait` runs every request added since the last one."""

    def __init__(self, policy: PolicyClient) -> None:
        self.policy = policy
        self._queued: list[tuple[int, GenerationRequest]] = []
        self._next = 0

    def add(self, requests: Sequence[GenerationRequest]) -> list[int]:
        ids = list(range(self._next, self._next + len(requests)))
        self._next += len(requests)
        self._queued += zip(ids, requests, strict=True)
        return ids

    def wait(self) -> list[tuple[int, list[GenerationOutput]]]:
        if not self._queued:
            return []
        queued, self._queued = self._queued, []
        outputs = self.policy.generate([r for _, r in queued])
        if len(outputs) != len(queued):
            raise ContractError(f"policy.generate returned {len(outputs)} results for {len(queued)} requests")
        return [(rid, list(outs)) for (rid, _), outs in zip(queued, outputs, strict=True)]

    def close(self) -> None:
        self._queued = []


def open_stream(policy: PolicyClient) -> GenerationStream:
    """The backend's own stream when it has one, else a :class:`BlockingStream` over ``generate``."""
    make = getattr(policy, "stream", None)
    return make() if callable(make) else BlockingStream(policy)
