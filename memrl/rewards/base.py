"""The reward contract: a batch of finished answers in, one scalar per answer out.

A reward is built by a factory registered in :data:`REWARDS` with one signature::

    @REWARDS.register("token_f1")
    def make_token_f1(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn: ...

and the built :class:`RewardFn` scores a whole batch at once (so ``llm_judge`` makes one generate call per
batch). ``options`` come from ``episode.reward_options``; ``ctx`` carries what some rewards need from the run
(the policy client, usable as a judge). Unknown option names raise :class:`RewardConfigError`.

Answers are extracted from the response text with :func:`memrl.formats.extract_answer` once, here, so every
reward scores the same string.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from memrl.formats import extract_answer, tagged_answer
from memrl.registry import Registry


class RewardConfigError(ValueError):
    """A reward was configured with unknown or invalid options."""


@dataclass(frozen=True)
class RewardInput:
    """One answer to score. ``response`` is the full decoded response (tool calls and results included);
    ``answer`` the extracted final answer (the tag's content, else the prose without tool segments); ``tagged``
    whether the response has a complete ``<answer>…</answer>``; ``gold`` is ``None`` for questions without a gold answer (LoCoMo
    adversarial, LongMemEval abstention); ``metadata`` is the episode's ``BatchInput.metadata``."""

    response: str
    gold: str | None
    question: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    answer: str = ""
    tagged: bool = False

    @classmethod
    def from_response(
        cls, response: str, gold: str | None, question: str = "", metadata: Mapping[str, Any] | None = None
    ) -> RewardInput:
        return cls(
            response=response,
            gold=gold,
            question=question,
            metadata=dict(metadata or {}),
            answer=extract_answer(response),
            tagged=tagged_answer(response) is not None,
        )


class RewardFn(Protocol):
    """Scores a batch; returns one finite float per input, in input order."""

    name: str

    def __call__(self, inputs: Sequence[RewardInput]) -> list[float]: ...


@dataclass
class RewardContext:
    """Run resources a reward may use. ``policy`` is any PolicyClient (the ``llm_judge`` reward needs one)."""

    policy: Any = None


RewardFactory = Callable[[Mapping[str, Any], RewardContext], RewardFn]


def _populate() -> None:
    for module in ("text", "benchmarks", "format", "judge", "composite"):
        importlib.import_module(f"memrl.rewards.{module}")


REWARDS: Registry[RewardFactory] = Registry("reward", populate=_populate)


@dataclass
class PerItemReward:
    """Adapter from a per-answer scoring function to the batch :class:`RewardFn` protocol."""

    name: str
    fn: Callable[[RewardInput], float]

    def __call__(self, inputs: Sequence[RewardInput]) -> list[float]:
        return [float(self.fn(x)) for x in inputs]


def check_options(name: str, options: Mapping[str, Any], valid: Mapping[str, Any]) -> dict[str, Any]:
    """``valid`` maps option names to defaults; returns defaults updated with ``options``."""
    unknown = set(options) - set(valid)
    if unknown:
        raise RewardConfigError(
            f"reward {name!r}: unknown option(s) {sorted(unknown)}; valid options: {sorted(valid) or '(none)'}"
        )
    return {**valid, **options}


def make_reward(
    name: str, options: Mapping[str, Any] | None = None, ctx: RewardContext | None = None
) -> RewardFn:
    """Build a reward by registry name (or ``package.module:factory``)."""
    return REWARDS.get(name)(dict(options or {}), ctx or RewardContext())
