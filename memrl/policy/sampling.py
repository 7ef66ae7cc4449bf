"""Token selection shared by the in-process backends: temperature, top-p, seeded sampling, logprobs, stops.

Logprobs follow the :class:`~memrl.types.GenerationOutput` contract: log-softmax of ``logits / temperature``
(temperature 1 for greedy rows), before top-p filtering, so they match what a trainer recomputes with the same
temperature.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from memrl.policy.base import SamplingParams


@dataclass
class TokenChoice:
    """One selected token: its id, log-probability and the top-k alternatives (id → logprob)."""

    token: int
    logprob: float
    top: dict[int, float]


def choose_tokens(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> list[TokenChoice]:
    """Select one token per row.

    ``logits``: ``[B, V]`` next-token logits; ``params[i]`` / ``generators[i]`` belong to row ``i``
    (a generator per row makes sampling independent of how rows are batched).
    """
    temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], dtype=torch.float32)
    logp = torch.log_softmax(logits.float() / temps[:, None], dim=-1)  # [B, V]
    chosen = logp.argmax(dim=-1)  # greedy default
    for i, p in enumerate(params):
        if p.temperature > 0:
            chosen[i] = _sample_row(logp[i], p.top_p, generators[i])
    kmax = max((p.top_logprobs for p in params), default=0)
    top_vals = top_ids = None
    if kmax > 0:
        top_vals, top_ids = torch.topk(logp, k=min(kmax, logp.shape[-1]), dim=-1)  # [B, k]
        top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
    picked = logp.gather(-1, chosen[:, None]).squeeze(-1).tolist()
    out = []
    for i, p in enumerate(params):
        top = {}
        if p.top_logprobs > 0:
            top = dict(zip(top_ids[i][: p.top_logprobs], top_vals[i][: p.top_logprobs], strict=True))
        out.append(TokenChoice(int(chosen[i]), float(picked[i]), top))
    return out


def _sample_row(logp: torch.Tensor, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """Nucleus sampling from one row of log-probs ``[V]``: keep the smallest set of tokens whose mass reaches
    ``top_p`` (always at least the most likely token)."""
    probs = logp.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        # Drop a token when the mass *before* it already reaches top_p.
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@functools.lru_cache(maxsize=1 << 17)
def _piece(tokenizer, token_id: int) -> str:
    """One token decoded alone (cached: the slow tokenizers' decode dominated long generations)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


class StopChecker:
    """Decides, after each appended token, whether one sequence is finished.

    Stop strings are searched in the decoded *generated* text only (as vLLM does); the token that completes a
    stop string is kept, so the output text ends with the stop string (a multi-character token may carry
    characters past it; byte-level vocabularies never do).
    """

    def __init__(
        self, tokenizer, stop: Sequence[str], stop_token_ids: Sequence[int], eos_ids: Sequence[int]
    ) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.stop_ids = frozenset(int(t) for t in stop_token_ids)
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        longest = max((len(s) for s in self.stop), default=0)
        # A stop string completed by the newest token ends in the text that token adds, so a token whose own text
        # lacks every stop string's last character cannot finish one. Not safe when a stop string ends in
        # whitespace (tokenizers may drop a token's leading space when decoding it alone). A token that decodes
        # alone to nothing or to part of a character (U+FFFD) adds no ASCII character, so it is skipped too when
        # every stop string is ASCII, and gets the full check otherwise.
        self._finals = frozenset(s[-1] for s in self.stop)
        self._prefilter = not any(c.isspace() for c in self._finals)
        self._ascii = all(s.isascii() for s in self.stop)
        # A stop string is found at the step that completes it, so it lies within the last few tokens: decoding
        # only those keeps a check O(1) instead of O(output) (a 192-token output decoded 192 times cost more
        # than its forward passes). A token carries at least one byte; a character at most 4; +4 for slack.
        self._window = 4 * (longest + 4)

    def check(self, out_ids: Sequence[int]) -> tuple[bool, str | int | None]:
        """``(finished, stop_reason)``: the stop token id, the stop string, or ``None`` for eos."""
        last = out_ids[-1]
        if last in self.stop_ids:
            return True, int(last)
        if last in self.eos_ids:
            return True, None
        if not self.stop:
            return False, None
        if self._prefilter:
            piece = _piece(self.tokenizer, int(last))
            partial = not piece or "\ufffd" in piece
            if self._finals.isdisjoint(piece) and (self._ascii or not partial):
                return False, None
        text = self.tokenizer.decode(list(out_ids[-self._window :]), skip_special_tokens=False)
        hits = [(text.find(s), s) for s in self.stop]
        hits = [(pos + len(s), s) for pos, s in hits if pos >= 0]
        if hits:
            return True, min(hits)[1]
        return False, None
