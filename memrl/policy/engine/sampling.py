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
    seeds: Sequence[int],
    steps: Sequence[int],
) -> list[TokenChoice]:
    """Select one token per row.

    ``logits``: ``[B, V]`` next-token logits; ``params[i]`` belongs to row ``i``, whose sampled token is drawn
    with the uniform ``counter_uniform(seeds[i], steps[i])`` (``steps[i]`` = tokens the row generated so far).
    The draw depends on the row alone, never on how rows are batched, and all rows sample in a few batched
    ops (a per-row ``torch.multinomial`` with its own generator costs a call per row per token on CPU, and would be
    a kernel launch per row per step on a GPU).
    """
    temps = [p.temperature if p.temperature > 0 else 1.0 for p in params]
    temps = torch.tensor(temps, dtype=torch.float32, device=logits.device)
    logp = torch.log_softmax(logits.float() / temps[:, None], dim=-1)  # [B, V]
    chosen = logp.argmax(dim=-1)  # greedy default
    sampled = [i for i, p in enumerate(params) if p.temperature > 0]
    if sampled:
        rows = torch.tensor(sampled, device=logp.device)
        top_p = torch.tensor([params[i].top_p for i in sampled], dtype=torch.float32, device=logp.device)
        u = counter_uniform(
            torch.tensor([seeds[i] for i in sampled]), torch.tensor([steps[i] for i in sampled])
        )
        chosen[rows] = sample_inverse_cdf(logp[rows].exp(), top_p, u.to(logp.device))
    kmax = max((p.top_logprobs for p in params), default=0)
    top_vals = top_ids = None
    if kmax > 0:
        top_vals, top_ids = torch.topk(logp, k=min(kmax, logp.shape[-1]), dim=-1)  # [B, k]
        top_vals, top_ids = top_vals.tolist(), top_ids.tolist()
    picked = logp.gather(-1, chosen[:, None]).squeeze(-1).tolist()
    chosen_ids = chosen.tolist()
    out = []
    for i, p in enumerate(params):
        top = {}
        if p.top_logprobs > 0:
            top = dict(zip(top_ids[i][: p.top_logprobs], top_vals[i][: p.top_logprobs], strict=True))
        out.append(TokenChoice(int(chosen_ids[i]), float(picked[i]), top))
    return out


def sample_inverse_cdf(probs: torch.Tensor, top_p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of ``probs [B, V]`` by inverse CDF with uniforms ``u [B]`` in (0, 1], after nucleus
    filtering with ``top_p [B]``: keep the smallest set of most likely tokens whose mass reaches ``top_p``
    (always at least the most likely token). A zero-probability token is never chosen."""
    if bool((top_p < 1.0).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Drop a token when the mass *before* it already reaches top_p.
        drop = (sorted_p.cumsum(-1) - sorted_p) >= top_p[:, None]
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    cdf = probs.double().cumsum(-1)  # float64: a 150k-token vocabulary's running sum stays exact enough
    target = u.double() * cdf[:, -1]
    # The first index whose cdf reaches the target; target > 0, so a flat (zero-mass) step is never it.
    idx = torch.searchsorted(cdf, target[:, None]).squeeze(-1)
    return idx.clamp(max=probs.shape[-1] - 1)


_GOLDEN = -7046029254386353131  # 0x9E3779B97F4A7C15 as a signed int64 (splitmix64's increment)
_MIX1 = -4658895280553007687  # 0xBF58476D1CE4E5B9
_MIX2 = -7723592293110705685  # 0x94D049BB133111EB


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` keeps the sign bit)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def counter_uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Uniforms in (0, 1] (float64, 53 random bits) from splitmix64 of ``seed`` at counter ``step + 1``: a
    counter-based generator, so draw ``n`` of a row needs no state and any batch of rows is drawn at once.
    int64 products wrap modulo 2**64 as splitmix64 wants (checked against a pure-Python reference in tests)."""
    z = seeds.long() + (steps.long() + 1) * _GOLDEN
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return (_shr(z, 11) + 1).double() / float(1 << 53)


@functools.lru_cache(maxsize=1 << 17)
def _piece(tokenizer, token_id: int) -> str:
    """One token decoded alone (cached: the slow tokenizers' decode dominated long generations)."""
    return tokenizer.decode([token_id], skip_special_tokens=False)


@functools.lru_cache(maxsize=1 << 16)
def _can_end_in(stops: tuple[str, ...], piece: str) -> bool:
    """Whether some stop string can end inside ``piece`` (the newest token's own text): at a character ``j`` equal
    to its last one, either ``piece[:j+1]`` ends with the whole stop string, or the stop string ends with
    ``piece[:j+1]`` (its start then came from earlier tokens). Testing only the last character sent every
    multi-character token holding a ``>`` (``<extra_id_7>``, ``/>``) to a full window decode."""
    for stop in stops:
        for j, ch in enumerate(piece):
            if ch == stop[-1]:
                head = piece[: j + 1]
                if head.endswith(stop) or stop.endswith(head):
                    return True
    return False


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
        # cannot hold the end of any stop string cannot finish one (see _can_end_in). Not safe when a stop string ends in
        # whitespace (tokenizers may drop a token's leading space when decoding it alone). A token that decodes
        # alone to nothing or to part of a character (U+FFFD) adds no ASCII character, so it is skipped too when
        # every stop string is ASCII, and gets the full check otherwise.
        self._finals = frozenset(s[-1] for s in self.stop)
        self._prefilter = not any(c.isspace() for c in self._finals)
        self._ascii = all(s.isascii() for s in self.stop)
        # A stop string is found at the step that completes it, so it lies within the last few tokens: decoding
        # only those keeps a check O(1) instead of O(output) (decoding the whole output at every step can cost
        # more than the forward passes). A token carries at least one byte; a character at most 4; +4 for slack.
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
            if not _can_end_in(self.stop, piece) and (self._ascii or not partial):
                return False, None
        text = self.tokenizer.decode(list(out_ids[-self._window :]), skip_special_tokens=False)
        hits = [(text.find(s), s) for s in self.stop]
        hits = [(pos + len(s), s) for pos, s in hits if pos >= 0]
        if hits:
            return True, min(hits)[1]
        return False, None
