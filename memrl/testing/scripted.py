"""``scripted``: a deterministic PolicyClient that emits what a script says, for state-machine tests and benches.

A *script* maps the context (token ids, decoded text, sampling seed, sample index) to the continuation the
"model" wants to write (text or token ids, optional per-token logprobs and top-k logprobs). The client then
behaves like a real backend: it honours ``max_tokens`` (finish ``length``), eos and ``stop_token_ids``, stop
strings (cut right after the first stop string, which stays in the output, finish ``stop`` with
``stop_reason``), ``n`` samples per request, and prefix caching: every prompt and every output it produced is
remembered token by token, and a request's longest remembered prefix (leaving one token to compute, as the HF
backend does) is reported as ``cached_tokens``.

When a continuation is cut by ``max_tokens``, the rest of it is remembered under the exact token state, so a
request that continues from that state gets the rest of the plan (as a model continuing its own text would),
unless ``continue_plans=False``.

    policy = ScriptedPolicy(tokenizer, lambda ctx: "<python>print(1)</python>" if "<result>" not in ctx.text
                            else "<answer>1</answer>")
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.registry import Registry
from memrl.testing.models import byte_tokenizer
from memrl.types import ContractError, FinishReason, GenerationOutput

DEFAULT_LOGPROB = -0.25


@dataclass(frozen=True)
class ScriptContext:
    prompt_ids: tuple[int, ...]
    text: str
    seed: int | None
    sample_index: int


@dataclass(frozen=True)
class ScriptedTurn:
    """What the scripted model writes next. Give ``text`` or ``token_ids``. ``eos`` appends the eos token.
    ``logprobs``/``top_logprobs`` default to :data:`DEFAULT_LOGPROB` and a fixed top-k around the token."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[Mapping[int, float], ...] | None = None
    eos: bool = True


Script = Callable[[ScriptContext], "ScriptedTurn | str"]


@dataclass
class _Plan:
    token_ids: list[int]
    logprobs: list[float]
    tops: list[Mapping[int, float]] | None


@dataclass
class ScriptedStats:
    """Work the client did, counted as a real backend would: prefill = prompt tokens not served from its prefix
    cache (once per request, shared by its ``n`` samples); decode = generated tokens."""

    generate_calls: int = 0
    requests: int = 0
    prefill_tokens: int = 0
    cached_tokens: int = 0
    decode_tokens: int = 0
    max_batch: int = 0
    batch_sizes: list[int] = field(default_factory=list)


class ScriptedPolicy:
    """Deterministic PolicyClient driven by a script (see module docstring)."""

    def __init__(self, tokenizer: Any, script: Script, *, continue_plans: bool = True) -> None:
        self.tokenizer = tokenizer
        self.script = script
        self.continue_plans = continue_plans
        self.stats = ScriptedStats()
        self._seen: dict = {}  # token trie (nested dicts) of every prompt and output state produced
        self._plans: dict[tuple[int, ...], _Plan] = {}

    # -- PolicyClient -------------------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[GenerationOutput]]:
        self.stats.generate_calls += 1
        self.stats.batch_sizes.append(len(requests))
        self.stats.max_batch = max(self.stats.max_batch, len(requests))
        out = []
        for req in requests:
            cached = self._cached(req.prompt_ids)
            self._remember(req.prompt_ids)
            self.stats.requests += 1
            self.stats.prefill_tokens += len(req.prompt_ids) - cached
            self.stats.cached_tokens += cached
            out.append([self._sample(req, i, cached) for i in range(req.params.n)])
        return out

    def logprobs(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        return [[DEFAULT_LOGPROB] * len(resp) for _, resp in sequences]

    # -- internals ----------------------------------------------------------------------------------------

    def _cached(self, prompt: tuple[int, ...]) -> int:
        """The longest remembered prefix of ``prompt``, leaving its last token to compute."""
        node, n = self._seen, 0
        for tok in prompt[:-1]:
            if tok not in node:
                break
            node, n = node[tok], n + 1
        return n

    def _remember(self, tokens: tuple[int, ...]) -> None:
        node = self._seen
        for tok in tokens:
            node = node.setdefault(tok, {})

    def _plan_for(self, req: GenerationRequest, index: int) -> _Plan:
        if self.continue_plans and req.prompt_ids in self._plans:
            # Consumed once: the branch that was cut continues its plan; a later fork from the same state
            # (a sibling in a tree) samples afresh with its own seed, like a stochastic model would.
            return self._plans.pop(req.prompt_ids)
        ctx = ScriptContext(
            prompt_ids=req.prompt_ids,
            text=self.tokenizer.decode(list(req.prompt_ids)),
            seed=req.params.seed,
            sample_index=index,
        )
        turn = self.script(ctx)
        if isinstance(turn, str):
            turn = ScriptedTurn(text=turn)
        return self._plan_from_turn(turn)

    def _plan_from_turn(self, turn: ScriptedTurn) -> _Plan:
        if (turn.text is None) == (turn.token_ids is None):
            raise ContractError("ScriptedTurn: give exactly one of text or token_ids")
        ids = list(turn.token_ids) if turn.token_ids is not None else self._encode(turn.text or "")
        if turn.eos:
            ids.append(self.tokenizer.eos_token_id)
        if not ids:
            raise ContractError("ScriptedTurn: the script produced no tokens and no eos")
        lps = list(turn.logprobs) if turn.logprobs is not None else [DEFAULT_LOGPROB] * len(ids)
        tops = list(turn.top_logprobs) if turn.top_logprobs is not None else None
        if len(lps) != len(ids) or (tops is not None and len(tops) != len(ids)):
            raise ContractError(
                f"ScriptedTurn: {len(ids)} tokens (eos included) but {len(lps)} logprobs"
                f" / {len(tops) if tops is not None else '-'} top_logprobs"
            )
        return _Plan(ids, lps, tops)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _sample(self, req: GenerationRequest, index: int, cached: int) -> GenerationOutput:
        params = req.params
        plan = self._plan_for(req, index)
        emitted, finish, reason = self._cut(plan.token_ids, params)
        n = len(emitted)
        self.stats.decode_tokens += n
        rest = _Plan(plan.token_ids[n:], plan.logprobs[n:], plan.tops[n:] if plan.tops is not None else None)
        state = req.prompt_ids + tuple(emitted)
        if finish is FinishReason.LENGTH and rest.token_ids:
            self._plans[state] = rest
        self._remember(state)
        tops: tuple[Mapping[int, float], ...] = ()
        if params.top_logprobs > 0:
            given = plan.tops[:n] if plan.tops is not None else None
            tops = tuple(
                given[i]
                if given is not None
                else _default_top(emitted[i], plan.logprobs[i], params.top_logprobs)
                for i in range(n)
            )
        return GenerationOutput(
            token_ids=tuple(emitted),
            logprobs=tuple(plan.logprobs[:n]),
            finish_reason=finish,
            top_logprobs=tops,
            stop_reason=reason,
            prompt_token_ids=req.prompt_ids,
            cached_tokens=cached,
        )

    def _cut(
        self, ids: list[int], params: SamplingParams
    ) -> tuple[list[int], FinishReason, str | int | None]:
        """Emit tokens until eos / stop token / stop string / max_tokens, as a real decoder loop would."""
        eos = self.tokenizer.eos_token_id
        out: list[int] = []
        for tok in ids:
            out.append(tok)
            if tok == eos:
                return out, FinishReason.STOP, None
            if tok in params.stop_token_ids:
                return out, FinishReason.STOP, tok
            if params.stop:
                text = self.tokenizer.decode(out)
                fired = [s for s in params.stop if s in text]
                if fired:
                    return out, FinishReason.STOP, min(fired, key=text.find)
            if len(out) >= params.max_tokens:
                return out, FinishReason.LENGTH, None
        # The script ran out without eos: a real model would keep going; report it as length-limited.
        return out, FinishReason.LENGTH, None


def _default_top(token: int, logprob: float, k: int) -> dict[int, float]:
    """The sampled token plus k-1 alternatives sharing the remaining mass evenly (a valid distribution)."""
    rest = max(1e-6, 1.0 - math.exp(logprob))
    alt = math.log(rest / max(1, k - 1))
    top = {token: logprob}
    for j in range(1, k):
        top[token + j * 7 + 1000] = alt  # ids outside the byte vocabulary never collide with real tokens
    return top


def random_script(
    *,
    min_tokens: int = 8,
    max_tokens: int = 48,
    alphabet: str = "abcdefghijklmnopqrstuvwxyz ",
    top_k: int = 5,
) -> Script:
    """A script writing pseudo-random text whose content and length depend on (context, seed, sample index),
    with per-token top-k logprobs of varying entropy; different seeds give different continuations."""

    def script(ctx: ScriptContext) -> ScriptedTurn:
        rng = random.Random(hash((ctx.prompt_ids, ctx.seed, ctx.sample_index)) & 0xFFFFFFFF)
        length = rng.randint(min_tokens, max_tokens)
        text = "".join(rng.choice(alphabet) for _ in range(length))
        lps, tops = [], []
        for _ in range(length + 1):  # + eos
            weights = [rng.random() ** rng.choice((1, 4)) for _ in range(top_k)]
            total = sum(weights)
            probs = sorted((w / total for w in weights), reverse=True)
            lps.append(math.log(max(probs[0], 1e-9)))
            tops.append({1000 + j: math.log(max(p, 1e-9)) for j, p in enumerate(probs)})
        return ScriptedTurn(text=text, logprobs=tuple(lps), top_logprobs=tuple(tops))

    return script


def DEMO_SCRIPT(ctx: ScriptContext) -> str:  # noqa: N802  (a constant-like script for configs and docs)
    """Answers 42, whatever the question."""
    return "<answer>42</answer>"


def scripted_backend(cfg: PolicyConfig) -> ScriptedPolicy:
    """Backend factory (``policy.backend: scripted``): ``policy.model`` is ``random`` (:func:`random_script`)
    or a dotted path ``package.module:script`` to a :data:`Script`. The tokenizer is the byte-level one of
    :mod:`memrl.testing.models` (built from code, no files needed)."""
    if cfg.model == "random":
        script = random_script()
    else:
        if ":" not in cfg.model:
            raise ContractError(
                f"policy.model={cfg.model!r}: the scripted backend needs 'random' or 'package.module:script'"
            )
        script = Registry[Script]("script").get(cfg.model)
    return ScriptedPolicy(byte_tokenizer(), script)


def _register() -> None:
    from memrl.policy import BACKENDS

    if "scripted" not in BACKENDS:
        BACKENDS.register("scripted")(scripted_backend)


_register()
