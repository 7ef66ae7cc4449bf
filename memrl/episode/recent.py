"""The ``recent_history`` context (``episode.context``): the latest raw history turns that fit the policy's window.

The "full context" baseline of memory papers (mem0's) pastes the whole conversation into the prompt; a model with
an 8K window holds only its end. Turns are rendered like retrieved facts (``[timestamp] speaker: text``), oldest
first, as many of the most recent ones as fit ``max_model_len - max_response_tokens -``
:data:`QUESTION_RESERVE_TOKENS`. The slice is chosen without the question, so every question about one history
gets a byte-identical system message: the HF backend then prefills that shared prefix once per batch
(``HFPolicy._share_prompts``) instead of once per question.

Each turn's fact ``score`` is its position in the history, so a budget cut in
:meth:`~memrl.episode.prompt.PromptBuilder.build` (a question longer than the reserve) drops the oldest turns.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memrl.episode.config import EpisodeConfig
from memrl.episode.prompt import PromptBuilder, PromptFact
from memrl.templates import encode_chat
from memrl.types import TurnSpec

# Tokens left over for the question (the chat markup around it is counted exactly). Fixed rather than measured
# per question so that the slice, and with it the system message, is the same for every question of a history.
QUESTION_RESERVE_TOKENS = 256
# Histories whose slices are kept: episodes of one conversation arrive together (LoCoMo: ~200 questions each).
_CACHED_HISTORIES = 8


def turn_line(turn: TurnSpec) -> str:
    """A history turn as the prompt shows it (and as ``memrl eval`` counts the whole history)."""
    return f"[{turn.timestamp or 'undated'}] {turn.speaker}: {turn.text}"


@dataclass(frozen=True)
class HistorySlice:
    """``facts``: the included turns, oldest first (``id`` = position in the history); ``line_tokens``: the
    tokens of every history turn's line (:func:`turn_line`), in history order."""

    facts: tuple[PromptFact, ...]
    line_tokens: tuple[int, ...]

    def coverage(self, included_ids: Sequence[int]) -> dict[str, float]:
        """Turns and line tokens the prompt carries vs the whole history (step meta and trajectory metrics)."""
        ids = list(included_ids)
        return {
            "context_turns": float(len(ids)),
            "context_turns_total": float(len(self.line_tokens)),
            "context_tokens": float(sum(self.line_tokens[i] for i in ids)),
            "context_tokens_total": float(sum(self.line_tokens)),
        }


class RecentHistory:
    """Chooses history slices for one runner. ``window`` is the policy's ``max_model_len`` (``None``: a backend
    that does not say, then ``episode.prompt_token_budget`` bounds the prompt as for the other contexts)."""

    def __init__(
        self,
        cfg: EpisodeConfig,
        tokenizer: Any,
        *,
        window: int | None,
        max_response_tokens: int,
        tools: Sequence[str] = (),
    ) -> None:
        budget = cfg.prompt_token_budget if window is None else window - max_response_tokens
        if budget - QUESTION_RESERVE_TOKENS < 16:
            raise ValueError(
                f"episode.context=recent_history: a prompt budget of {budget} tokens (policy.max_model_len - "
                f"rollout.max_response_tokens) leaves no room for history after the {QUESTION_RESERVE_TOKENS}-token"
                " question reserve; raise policy.max_model_len or lower rollout.max_response_tokens"
            )
        self.tokenizer = tokenizer
        self.tools = list(tools)
        # The prompt may use the reserve for the question; only a longer question makes the builder cut turns.
        self.builder = PromptBuilder(dataclasses.replace(cfg, prompt_token_budget=budget), tokenizer)
        self.limit = budget - QUESTION_RESERVE_TOKENS
        self._slices: OrderedDict[tuple, HistorySlice] = OrderedDict()

    def select(self, history: Sequence[TurnSpec]) -> HistorySlice:
        key = tuple((t.turn_id, t.speaker, t.timestamp, t.text) for t in history)
        hit = self._slices.get(key)
        if hit is None:
            hit = self._slices[key] = self._select(history)
            while len(self._slices) > _CACHED_HISTORIES:
                self._slices.popitem(last=False)
        self._slices.move_to_end(key)
        return hit

    def _select(self, history: Sequence[TurnSpec]) -> HistorySlice:
        lines = [turn_line(t) for t in history]
        costs = (
            tuple(len(x) for x in self.tokenizer(lines, add_special_tokens=False)["input_ids"])
            if lines
            else ()
        )
        facts = [
            PromptFact(id=i, text=t.text, timestamp=t.timestamp, speaker=t.speaker, score=float(i))
            for i, t in enumerate(history)
        ]
        # The oldest turn that still fits, by bisection over the rendered prompt (fewer turns never take more
        # tokens): exact whatever the template adds around a turn or how tokens merge across lines, and about ten
        # renderings per history (LoCoMo: ~600 turns), once per history thanks to the cache in select().
        lo, hi = 0, len(facts)
        while lo < hi:
            mid = (lo + hi) // 2
            if self._tokens(facts[mid:]) <= self.limit:
                hi = mid
            else:
                lo = mid + 1
        return HistorySlice(tuple(facts[lo:]), costs)

    def _tokens(self, facts: Sequence[PromptFact]) -> int:
        """Prompt tokens with ``facts`` and an empty question (chat markup included)."""
        system = self.builder.render_system(facts, "", self.tools)
        return len(
            encode_chat(
                self.tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": ""}]
            )
        )
