"""Short-term compression: recent turns → a summary within a token budget (registry, batched signature).

``extractive`` (default) keeps the most salient recent sentences, in their original order, speaker-attributed;
``llm`` asks the policy through a :data:`~memrl.memory.extract.TextGenerator`. The system wraps every result
in ``MemoryOp(COMPRESS, summary_id=...)``; a failed LLM summary keeps the previous one and is logged as a
``NOOP`` with the reason.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from memrl.memory.config import MemoryConfig
from memrl.memory.extract import TextGenerator, split_sentences, turn_caption
from memrl.memory.stopwords import SALIENCE_STOP_WORDS
from memrl.registry import Registry
from memrl.templates import load_template
from memrl.types import TurnSpec

logger = logging.getLogger(__name__)

TokenCounter = Callable[[Sequence[str]], list[int]]

_WORD = re.compile(r"[A-Za-z0-9']+")


@dataclass(frozen=True)
class CompressRequest:
    turns: tuple[TurnSpec, ...]
    previous: str = ""


@dataclass(frozen=True)
class CompressResult:
    """``ok=False`` means the compressor failed (``reason`` says why) and the previous summary stays."""

    summary: str
    ok: bool = True
    reason: str = ""


class Compressor(Protocol):
    def compress(self, requests: Sequence[CompressRequest]) -> list[CompressResult]: ...


CompressorFactory = Callable[[MemoryConfig, "TextGenerator | None", TokenCounter], Compressor]
COMPRESSORS: Registry[CompressorFactory] = Registry("compressor")


def regex_token_count(texts: Sequence[str]) -> list[int]:
    """Approximate tokens (words and punctuation); used when no model tokenizer is at hand."""
    return [len(re.findall(r"\w+|[^\w\s]", t)) for t in texts]


def salience(sentence: str) -> float:
    """Content words, numbers and capitalised (name-like) words, sub-linear in length so one long rambling
    sentence does not beat two informative short ones."""
    words = _WORD.findall(sentence)
    if not words:
        return 0.0
    content = [w for w in words if w.lower() not in SALIENCE_STOP_WORDS]
    names = sum(1 for w in words[1:] if w[0].isupper())
    numbers = sum(1 for w in words if any(c.isdigit() for c in w))
    return (len(content) + 2.0 * names + 2.0 * numbers) / (len(words) ** 0.5)


class ExtractiveCompressor:
    """Greedy pick of the most salient sentences (recency breaks near-ties) within ``summary_token_budget``."""

    def __init__(self, cfg: MemoryConfig, count_tokens: TokenCounter) -> None:
        self.budget = cfg.summary_token_budget
        self.window = cfg.compress_window
        self.count_tokens = count_tokens

    def _summarise(self, turns: Sequence[TurnSpec]) -> str:
        pieces: list[tuple[int, str]] = []  # (turn index, sentence)
        recent = list(turns[-self.window :])
        for ti, turn in enumerate(recent):
            sentences = split_sentences(turn.text)
            caption = turn_caption(turn)
            if caption:
                sentences.append(f"[shares a photo: {caption}]")
            pieces.extend((ti, s) for s in sentences)
        if not pieces:
            return ""
        prefix = [f"{t.speaker}: " if t.speaker else "" for t in recent]
        # Budget each sentence with its speaker prefix (worst case: it starts a new turn in the summary).
        costs = self.count_tokens([prefix[ti] + s for ti, s in pieces])
        n = len(pieces)
        # Recency adds up to 1.0 so that among equally informative sentences the newest wins.
        order = sorted(range(n), key=lambda i: salience(pieces[i][1]) + i / n, reverse=True)
        chosen, used = [], 0
        for i in order:
            if used + costs[i] <= self.budget:
                chosen.append(i)
                used += costs[i]
        by_turn: dict[int, list[str]] = {}
        for i in sorted(chosen):
            by_turn.setdefault(pieces[i][0], []).append(pieces[i][1])
        return " ".join(prefix[ti] + " ".join(ss) for ti, ss in by_turn.items())

    def compress(self, requests: Sequence[CompressRequest]) -> list[CompressResult]:
        return [CompressResult(self._summarise(r.turns)) for r in requests]


@COMPRESSORS.register("extractive")
def _extractive(
    cfg: MemoryConfig, generate_text: TextGenerator | None, count_tokens: TokenCounter
) -> Compressor:
    return ExtractiveCompressor(cfg, count_tokens)


class LlmCompressor:
    """One ``generate_text`` call for all requests; over-long replies are cut at a sentence boundary."""

    def __init__(
        self, cfg: MemoryConfig, generate_text: TextGenerator | None, count_tokens: TokenCounter
    ) -> None:
        if generate_text is None:
            raise ValueError(
                "memory.compressor=llm needs a text generator: MemorySystem(cfg, generate_text="
                "policy_text_generator(policy_client)) (memrl.memory.llm)"
            )
        self.template = load_template("memory_compress.j2")
        self.generate_text = generate_text
        self.count_tokens = count_tokens
        self.budget = cfg.summary_token_budget
        self.window = cfg.compress_window

    def _fit(self, text: str) -> str:
        sentences = split_sentences(text)
        costs = self.count_tokens(sentences) if sentences else []
        kept, used = [], 0
        for s, c in zip(sentences, costs, strict=True):
            if used + c > self.budget:
                break
            kept.append(s)
            used += c
        return " ".join(kept)

    def compress(self, requests: Sequence[CompressRequest]) -> list[CompressResult]:
        if not requests:
            return []
        prompts = [
            self.template.render(previous=r.previous, turns=list(r.turns[-self.window :]), budget=self.budget)
            for r in requests
        ]
        replies = self.generate_text(prompts)
        if len(replies) != len(requests):
            raise RuntimeError(f"text generator returned {len(replies)} replies for {len(requests)} prompts")
        out = []
        for req, reply in zip(requests, replies, strict=True):
            summary = self._fit((reply or "").strip())
            if not summary:
                reason = f"llm summary empty or longer than its first sentence allows: {reply[:80]!r}"
                logger.warning("llm compressor: %s; keeping the previous summary", reason)
                out.append(CompressResult(req.previous, ok=False, reason=reason))
            else:
                out.append(CompressResult(summary))
        return out


@COMPRESSORS.register("llm")
def _llm(cfg: MemoryConfig, generate_text: TextGenerator | None, count_tokens: TokenCounter) -> Compressor:
    return LlmCompressor(cfg, generate_text, count_tokens)
