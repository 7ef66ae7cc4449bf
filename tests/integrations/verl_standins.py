"""CPU stand-ins for verl's GPU-bound LLM server client: the same async ``generate`` signature and output fields
as verl 0.9's ``LLMServerClient.generate`` → ``TokenOutput``, backed by a memrl PolicyClient (a tiny HF model or a
scripted policy). Importable without verl."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from memrl.policy.base import GenerationRequest, SamplingParams


@dataclass
class TokenOutputLike:
    """The fields of verl's ``TokenOutput`` that agent loops read."""

    token_ids: list[int]
    log_probs: list[float] | None = None
    routed_experts: Any = None
    stop_reason: str | None = None
    num_preempted: int | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)


def sampling_from_verl(params: dict[str, Any], default_max_tokens: int) -> SamplingParams:
    """verl's sampling dict (vLLM keys) → memrl SamplingParams (``top_k`` is ignored: memrl samples top-p)."""
    return SamplingParams(
        temperature=float(params.get("temperature", 1.0)),
        top_p=float(params.get("top_p", 1.0)),
        max_tokens=int(params.get("max_tokens", default_max_tokens)),
        stop=tuple(params.get("stop") or ()),
        stop_token_ids=tuple(params.get("stop_token_ids") or ()),
    )


class PolicyServerClient:
    """``await client.generate(request_id, prompt_ids=..., sampling_params=...)`` over a memrl PolicyClient.

    ``calls`` records every (prompt_ids, sampling_params) it served."""

    def __init__(self, policy: Any, default_max_tokens: int = 64) -> None:
        self.policy = policy
        self.default_max_tokens = default_max_tokens
        self.calls: list[tuple[list[int], dict[str, Any]]] = []

    async def generate(self, request_id: str, *, prompt_ids, sampling_params, **_: Any) -> TokenOutputLike:
        self.calls.append((list(prompt_ids), dict(sampling_params)))
        params = sampling_from_verl(sampling_params, self.default_max_tokens)
        out = self.policy.generate([GenerationRequest(tuple(prompt_ids), params)])[0][0]
        return TokenOutputLike(
            token_ids=list(out.token_ids),
            log_probs=list(out.logprobs) if sampling_params.get("logprobs") else None,
            stop_reason="completed",
        )


def rollback_script(ctx) -> str:
    """A scripted episode that exercises tools and rollback: a broken call (NameError → rollback), the fixed call,
    then an answer quoting the tool's result."""
    tail = ctx.text.rsplit("<|assistant|>", 1)[-1]
    if "Write a corrected call" in tail and tail.count("<python>") == 1:
        return "<python>print(6 * 7)</python>"
    if "<result>" not in tail:
        return "<python>print(undefined_name)</python>"
    results = re.findall(r"<result>(.*?)</result>", tail, re.DOTALL)
    return f"<answer>{results[-1].strip()}</answer>"


_TURN = re.compile(r"^\[[^\]]*\] [A-Z][a-z]+: (.*)$", re.M)


def memory_script(ctx) -> str:
    """A scripted writer and answerer. Writes: ADD the turns that state something, except that odd samples write
    NOOP (so a snapshot / local group compares different replies). Answers: the newest fact's last word, odd
    samples ``unknown``."""
    if re.search(r"Operations:\s*(<\|assistant\|>)?\s*$", ctx.text):
        new = ctx.text.rsplit("New:", 1)[-1]
        if ctx.sample_index % 2:
            return "NOOP"
        lines = [f"ADD {t}" if re.search(r"\b(is|has|lives)\b", t) else "NOOP" for t in _TURN.findall(new)]
        return "\n".join(lines) or "NOOP"
    facts = re.findall(r"^- \[[^\]]*\] (.*?)$", ctx.text, re.M)
    word = facts[-1].rstrip(".").split()[-1] if facts and ctx.sample_index % 2 == 0 else "unknown"
    return f"<answer>{word}</answer>"
