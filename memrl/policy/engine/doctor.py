"""``memrl doctor MODEL``: whether memrl's HF engine serves a model, and decodes it as transformers does.

The engine decodes below transformers (:mod:`memrl.policy.engine.hf`): its own KV cache layers and attention function,
the radix prefix cache, padded and shared-prefix batches, prompt-lookup drafts. A model it cannot serve is refused
at load (:mod:`memrl.policy.engine.architecture`); one it serves should give transformers' greedy tokens on every path.
:func:`diagnose` loads the model through memrl's loader, reports what the engine sees of it (family, size,
precision, sliding window, chat template) and checks each engine path on a probe prompt against transformers'
``generate(do_sample=False)`` (attending through transformers' own ``sdpa``), plus the engine's log-probs against
one full forward. A run takes seconds for a tiny model, a minute or two for a 135M one on 2 CPU cores.

>>> report = diagnose("tiny:mistral")
>>> report.verdict, report.exit_code
('OK', 0)
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.architecture import architecture
from memrl.policy.engine.hf import HFPolicy
from memrl.policy.engine.load import load_model_and_tokenizer, model_max_len
from memrl.policy.engine.shared_attention import IMPLEMENTATION
from memrl.policy.errors import PolicyError
from memrl.policy.models import policy_dtype, resolve_model_path
from memrl.templates import encode_chat

TINY_PREFIX = "tiny:"  # tiny:<family>: a random tiny model of memrl.testing.architectures
NEW_TOKENS = 16  # greedy tokens each path writes
# Drafted tokens a step checks in the speculative check: policy.speculative_tokens' default.
SPECULATIVE = PolicyConfig.speculative_tokens
DEFAULT_PROBE = 300  # probe length of a model with global attention only
# Largest |engine log-prob - full-forward log-prob| that passes, and the log-prob gap between the two candidate
# tokens below which a first difference counts as a near tie (rounding may flip it), per precision: at least
# this, and twice transformers' own drift on the probe (Doctor.calibrate).
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.05, "float16": 0.02}
CHAT_PREVIEW = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is 2 + 2?"},
)
# Fields of a model's generation_config that change what transformers' generate writes (memrl's engine samples
# with each request's temperature and top_p only: rollout.temperature, rollout.top_p).
SAMPLING_FIELDS = (
    "do_sample",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "repetition_penalty",
    "no_repeat_ngram_size",
)
# Verdicts and their exit codes.
OK, FAIL, REFUSED = "OK", "parity FAIL", "refused"
EXIT_CODES = {OK: 0, FAIL: 1, REFUSED: 2}


@dataclass
class PathCheck:
    """One engine path against transformers: ``pass``, ``near tie`` (the first difference is at a position whose
    two candidate tokens are within rounding of each other) or ``FAIL``; ``first_diff`` indexes the new tokens."""

    path: str
    status: str
    compared: int = 0
    first_diff: int | None = None
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "FAIL"


@dataclass
class DoctorReport:
    """What :func:`diagnose` found. ``refusal`` is the engine's message where it refuses the model (no checks
    then); ``exit_code`` is 0 (OK), 1 (a path differs from transformers) or 2 (refused)."""

    model: str
    path: str
    model_type: str
    model_class: str
    parameters: int
    layers: int
    dtype: str
    device: str
    window: int | None
    sliding_layers: list[int]
    unsupported: list[str]
    chat_template: bool
    chat_preview: str
    bos_token: str | None
    adds_bos: bool
    generation_defaults: dict = field(default_factory=dict)  # the model's own SAMPLING_FIELDS (not applied)
    refusal: str | None = None
    probe_tokens: int = 0
    new_tokens: int = NEW_TOKENS
    tolerance: float = 0.0
    logprob_max_diff: float | None = None
    transformers_drift: float | None = None  # the same measure for transformers' own cached decode
    checks: list[PathCheck] = field(default_factory=list)
    verdict: str = OK
    exit_code: int = 0


# ------------------------------------------------------------------ loading and describing


def load(name: str, dtype: str = "auto", device: str = "cpu"):
    """``(model, tokenizer, path)``: ``tiny:<family>`` built from code, anything else through memrl's loader (an
    alias, a local directory or a hub id in the local cache)."""
    if name.startswith(TINY_PREFIX):
        from memrl.testing.architectures import FAMILIES, random_tiny

        family = name[len(TINY_PREFIX) :]
        if family not in FAMILIES:
            raise PolicyError(f"{name!r}: no tiny family {family!r}; valid: {', '.join(sorted(FAMILIES))}")
        model, tokenizer = random_tiny(family)
        resolved = policy_dtype(PolicyConfig(model=name, dtype=dtype, device=device))
        return model.to(device=device, dtype=getattr(torch, resolved)).eval(), tokenizer, name
    model, tokenizer = load_model_and_tokenizer(PolicyConfig(model=name, dtype=dtype, device=device))
    return model, tokenizer, resolve_model_path(name)


def _template(tokenizer) -> dict:
    """The chat template as memrl renders it: present or not, a one-line preview, whether it opens with bos."""
    found = {
        "chat_template": bool(getattr(tokenizer, "chat_template", None)),
        "bos_token": tokenizer.bos_token,
    }
    try:
        ids = encode_chat(tokenizer, CHAT_PREVIEW)
    except Exception as exc:  # a template that raises, or loses the system text (memrl.templates)
        return {**found, "chat_preview": f"(rendering fails: {exc})", "adds_bos": False}
    text = tokenizer.decode(ids, skip_special_tokens=False)
    bos = tokenizer.bos_token_id
    return {
        **found,
        "chat_preview": text.replace("\n", "\\n"),
        "adds_bos": bos is not None and ids[:1] == [bos],
    }


def describe(name: str, model, tokenizer, path: str) -> DoctorReport:
    """The report's description of the model, before any check."""
    arch = architecture(model)
    first = next(model.parameters())
    return DoctorReport(
        model=name,
        path=path,
        model_type=arch.model_type,
        model_class=type(model).__name__,
        parameters=sum(p.numel() for p in model.parameters()),
        layers=arch.layers,
        dtype=str(first.dtype).removeprefix("torch."),
        device=str(first.device),
        window=arch.window,
        sliding_layers=list(arch.sliding_layers),
        unsupported=list(arch.unsupported),
        generation_defaults=_generation_defaults(model),
        **_template(tokenizer),
    )


def _generation_defaults(model) -> dict:
    config = getattr(model, "generation_config", None)
    own = config.to_diff_dict() if config is not None else {}
    return {k: own[k] for k in SAMPLING_FIELDS if k in own}


# ------------------------------------------------------------------ the probe


def _probe_text() -> str:
    """The repository's README (natural text with repeats, which prompt lookup drafts from), else made-up text."""
    readme = Path(__file__).resolve().parents[2] / "README.md"
    if readme.is_file():
        return readme.read_text(encoding="utf-8")
    return " ".join(f"Fact {i}: the {i % 7}th box holds {i * 37 % 101} red balls." for i in range(400))


def probe_ids(tokenizer, total: int) -> list[int]:
    """``total`` token ids of the probe text, after bos where the tokenizer puts one first."""
    ids = [int(t) for t in tokenizer(_probe_text(), add_special_tokens=False)["input_ids"]]
    while len(ids) < total:
        ids = ids + ids
    first = tokenizer("x")["input_ids"][:1]
    bos = tokenizer.bos_token_id
    head = [bos] if bos is not None and first == [bos] else []
    return (head + ids)[:total]


def probe_length(requested: int | None, window: int | None, max_len: int) -> int:
    """The probe's length: as asked, else twice the window and more (every sliding layer cuts), else
    :data:`DEFAULT_PROBE`; always leaving room for the continuations and their new tokens."""
    n = requested or (2 * window + 37 if window else DEFAULT_PROBE)
    return max(8, min(n, max_len - 2 * NEW_TOKENS - 16))


# ------------------------------------------------------------------ transformers' side


@contextlib.contextmanager
def transformers_attention(model):
    """The model attending through transformers' own ``sdpa`` inside the block (the engine switched it to
    ``memrl_sdpa``, which is sdpa outside the engine's paths but with kernels of its own)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    current = getattr(base.config, "_attn_implementation", None)
    if current != IMPLEMENTATION:
        yield
        return
    base.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        base.set_attn_implementation(current)


@contextlib.contextmanager
def _generation_config(model, config):
    """``config`` as the model's generation config inside the block: transformers fills what a config passed to
    ``generate`` leaves at its defaults from the model's own (a repetition penalty, Qwen2.5's top-k ...)."""
    saved = model.generation_config
    model.generation_config = config
    try:
        yield
    finally:
        model.generation_config = saved


class Reference:
    """transformers' greedy outputs (with the log-prob its cached decode gave each token) and full-forward
    log-probs of a model; each prompt is generated once."""

    def __init__(self, model, eos_ids: Sequence[int], pad_id: int) -> None:
        from transformers import GenerationConfig

        self.model = model
        self.device = next(model.parameters()).device
        self.config = GenerationConfig(
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            eos_token_id=list(eos_ids),
            pad_token_id=pad_id,
            output_logits=True,
            return_dict_in_generate=True,
        )
        self._outputs: dict[tuple[int, ...], tuple[list[int], list[float]]] = {}

    def generate(self, prompt: Sequence[int]) -> list[int]:
        return self._generate(tuple(prompt))[0]

    def decode_logprobs(self, prompt: Sequence[int]) -> list[float]:
        """The log-prob of each token of :meth:`generate`'s output as transformers' cached decode computed it."""
        return self._generate(tuple(prompt))[1]

    @torch.inference_mode()
    def _generate(self, key: tuple[int, ...]) -> tuple[list[int], list[float]]:
        if key not in self._outputs:
            ids = torch.tensor([key], device=self.device)
            with transformers_attention(self.model), _generation_config(self.model, self.config):
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids))
            tokens = out.sequences[0, len(key) :].tolist()
            lps = [
                float(torch.log_softmax(lg[0].float(), -1)[t])
                for lg, t in zip(out.logits, tokens, strict=True)
            ]
            self._outputs[key] = tokens, lps
        return self._outputs[key]

    @torch.inference_mode()
    def logprobs(self, prompt: Sequence[int], out: Sequence[int]) -> torch.Tensor:
        """``[len(out), V]`` float32 log-softmax at each position of ``out`` under one forward."""
        ids = torch.tensor([list(prompt) + list(out[:-1])], device=self.device)
        with transformers_attention(self.model):
            logits = self.model(input_ids=ids, use_cache=False).logits[0, len(prompt) - 1 :]
        return torch.log_softmax(logits.float(), dim=-1)

    def drift(self, prompt: Sequence[int], tokens: Sequence[int], logprobs: Sequence[float]) -> float:
        """max |``logprobs`` - full-forward log-prob| over ``tokens``, the output of ``prompt``."""
        full = self.logprobs(prompt, tokens)
        theirs = full.gather(-1, torch.tensor(list(tokens), device=full.device)[:, None]).squeeze(-1).cpu()
        return float((torch.tensor(list(logprobs)) - theirs).abs().max())


def first_difference(
    engine: Sequence[int], ref: Sequence[int], eos_ids: Sequence[int]
) -> tuple[int, int | None]:
    """``(tokens compared, first differing index or None)``: up to the shorter output where one ended at eos
    (transformers stops there), else over both exactly."""
    ended = any(seq and seq[-1] in eos_ids for seq in (engine, ref))
    n = min(len(engine), len(ref)) if ended else max(len(engine), len(ref))
    for i in range(n):
        if i >= len(engine) or i >= len(ref) or engine[i] != ref[i]:
            return n, i
    return n, None


# ------------------------------------------------------------------ the checks


class Doctor:
    """The engine paths of one model, each compared with :class:`Reference` on the probe."""

    def __init__(self, model, tokenizer, cfg: PolicyConfig, probe: list[int], extra: list[int]) -> None:
        self.model, self.tokenizer, self.cfg = model, tokenizer, cfg
        self.probe, self.extra = probe, extra  # extra: the probe text's next tokens, for continuations
        self.policy = self.engine()  # raises PolicyError where the engine refuses the model
        self.ref = Reference(model, self.policy.eos_ids, self.policy.pad_id)
        self.tolerance = TOLERANCE.get(str(next(model.parameters()).dtype).removeprefix("torch."), 0.1)

    def engine(self, **overrides) -> HFPolicy:
        """A fresh engine (its own empty prefix cache and counters) over the shared model."""
        return HFPolicy(replace(self.cfg, **overrides), model=self.model, tokenizer=self.tokenizer)

    @staticmethod
    def run(policy: HFPolicy, prompts: Sequence[Sequence[int]], n: int = 1):
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, n=n)
        return policy.generate([GenerationRequest(tuple(p), params) for p in prompts])

    def compare(self, path: str, pairs, note: str = "") -> PathCheck:
        """``pairs``: (prompt, engine tokens); the check fails at the first pair that differs from transformers."""
        total = 0
        for k, (prompt, tokens) in enumerate(pairs):
            n, diff = first_difference(list(tokens), self.ref.generate(prompt), self.policy.eos_ids)
            if diff is not None:
                where = f"row {k}, " if len(pairs) > 1 else ""
                return self._differs(path, prompt, list(tokens), diff, where)
            total += n
        return PathCheck(path, "pass", total, None, f"{total} tokens match{note}")

    def _differs(self, path: str, prompt, tokens: list[int], i: int, where: str) -> PathCheck:
        ref = self.ref.generate(prompt)
        mine = tokens[i] if i < len(tokens) else None
        theirs = ref[i] if i < len(ref) else None
        detail = f"{where}token {i}: engine {mine}, transformers {theirs}"
        if mine is None or theirs is None:
            return PathCheck(path, "FAIL", i, i, detail + " (one output ended first)")
        logp = self.ref.logprobs(prompt, ref[: i + 1])[i]
        gap = abs(float(logp[theirs] - logp[mine]))
        status = "near tie" if gap <= self.tolerance else "FAIL"
        return PathCheck(path, status, i, i, f"{detail}; their log-probs differ by {gap:.2g}")

    def plain(self) -> tuple[PathCheck, object]:
        [[out]] = self.run(self.policy, [self.probe])
        return self.compare("plain decode", [(self.probe, out.token_ids)]), out

    def radix(self, first) -> PathCheck:
        """A prompt extending the probe by its reply and a few tokens, through the engine that cached both."""
        prompt = self.probe + list(first.token_ids) + self.extra[:5]
        [[out]] = self.run(self.policy, [prompt])
        check = self.compare("radix-cache continuation", [(prompt, out.token_ids)])
        if check.ok and out.cached_tokens == 0:
            return PathCheck(check.path, "FAIL", check.compared, None, "the prefix cache served no token")
        check.detail += f", {out.cached_tokens} of {len(prompt)} prompt tokens from the cache"
        return check

    def padded_batch(self) -> PathCheck:
        """Two prompts of different lengths in one left-padded batch (one padded prefill, as on an accelerator)."""
        policy = self.engine(prefix_cache_tokens=0)
        policy.ragged_prefill = False
        prompts = [self.probe, self.probe[: len(self.probe) // 2]]
        outs = self.run(policy, prompts)
        return self.compare("padded batch", [(p, o.token_ids) for p, [o] in zip(prompts, outs, strict=True)])

    def shared_prefix(self) -> PathCheck:
        """Two samples of the probe (continuing from its cached ``prompt[:-1]``), then two tails of different
        lengths after it: rows that attend to one stored copy of their common prefix."""
        policy = self.engine()
        [samples] = self.run(policy, [self.probe], n=2)
        tails = [self.probe + self.extra[:3], self.probe + self.extra[:7]]
        outs = self.run(policy, tails)
        pairs = [(self.probe, o.token_ids) for o in samples] + [
            (p, o.token_ids) for p, [o] in zip(tails, outs, strict=True)
        ]
        return self.compare("shared-prefix batch", pairs)

    def speculative(self) -> PathCheck:
        """Drafts on, for the probe and for a prompt that ends by repeating an earlier stretch of it (a trained
        model goes on copying, so drafts are kept), decoded together."""
        policy = self.engine(speculative_tokens=SPECULATIVE, prefix_cache_tokens=0)
        start = len(self.probe) // 4
        prompts = [self.probe, self.probe + self.probe[start : start + 24]]
        outs = self.run(policy, prompts)
        stats = policy.forward_stats
        note = f"; {stats['accepted_tokens']} of {stats['draft_tokens']} drafted tokens kept"
        pairs = [(p, o.token_ids) for p, [o] in zip(prompts, outs, strict=True)]
        return self.compare(f"speculative drafts ({SPECULATIVE})", pairs, note)

    def calibrate(self) -> float:
        """Widen :attr:`tolerance` to twice transformers' own drift: how far its cached decode of the probe
        strays from one full forward (rounding: ~0.1 in bfloat16 for a 135M model, ~1e-5 in float32)."""
        drift = self.ref.drift(
            self.probe, self.ref.generate(self.probe), self.ref.decode_logprobs(self.probe)
        )
        self.tolerance = max(self.tolerance, 2 * drift)
        return drift

    def logprobs(self, out, drift: float) -> tuple[PathCheck, float]:
        worst = self.ref.drift(self.probe, out.token_ids, out.logprobs)
        status = "pass" if worst <= self.tolerance else "FAIL"
        detail = (
            f"max |engine - full forward| {worst:.2g}; transformers' own {drift:.2g}; "
            f"tolerance {self.tolerance:.2g}"
        )
        return PathCheck("log-probs", status, len(out.token_ids), None, detail), worst

    def checks(self) -> list[PathCheck]:
        """Every path, in order; sets :attr:`drift` (transformers') and :attr:`worst` (the engine's)."""
        self.drift = self.calibrate()
        plain, first = self.plain()
        lp_check, self.worst = self.logprobs(first, self.drift)
        return [
            plain,
            self.radix(first),
            self.padded_batch(),
            self.shared_prefix(),
            self.speculative(),
            lp_check,
        ]


# ------------------------------------------------------------------ the whole diagnosis


def diagnose(
    name: str,
    dtype: str = "auto",
    device: str = "cpu",
    probe_tokens: int | None = None,
    model=None,
    tokenizer=None,
) -> DoctorReport:
    """Load ``name`` (or take ``model`` and ``tokenizer``), describe it and check every engine path."""
    path = name
    if model is None:
        model, tokenizer, path = load(name, dtype, device)
    report = describe(name, model, tokenizer, path)
    # Plain decode runs without drafts: the speculative check compares drafts on against it.
    cfg = PolicyConfig(model=name, device=report.device, max_model_len=1 << 30, speculative_tokens=0)
    try:
        doctor = _doctor(model, tokenizer, cfg, probe_tokens, report)
    except PolicyError as exc:
        return _verdict(replace(report, refusal=str(exc)))
    report.checks = doctor.checks()
    report.logprob_max_diff, report.transformers_drift = doctor.worst, doctor.drift
    report.tolerance = doctor.tolerance
    return _verdict(report)


def _doctor(model, tokenizer, cfg: PolicyConfig, probe_tokens: int | None, report: DoctorReport) -> Doctor:
    n = probe_length(probe_tokens, report.window, model_max_len(model))
    ids = probe_ids(tokenizer, n + 8)
    doctor = Doctor(model, tokenizer, cfg, ids[:n], ids[n:])
    report.probe_tokens = n
    return doctor


def _verdict(report: DoctorReport) -> DoctorReport:
    if report.refusal:
        report.verdict = REFUSED
    else:
        report.verdict = OK if all(c.ok for c in report.checks) else FAIL
    report.exit_code = EXIT_CODES[report.verdict]
    return report
