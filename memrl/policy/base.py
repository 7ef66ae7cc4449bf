"""The PolicyClient contract: token ids in, token ids + logprobs out.

Every backend (``hf``, ``vllm``, ``openai``) implements :class:`PolicyClient`. Text that already has ids is
never re-tokenised. Tree search needs per-token logprobs, top-k alternatives (entropy), finish/stop reasons,
per-request ``max_tokens``. Requests always carry their full context; **prefix reuse** is the backend's
business: the HF backend keeps a radix (token-trie) KV cache, vLLM and SGLang match token prefixes themselves,
so branches that share a prefix do not recompute it and report the reused part as ``cached_tokens``.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from memrl.policy.errors import PolicyError
from memrl.types import ContractError, GenerationOutput


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling. ``n`` samples share the prompt. ``top_logprobs=k`` returns the k most likely
    alternatives at each position."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    n: int = 1
    seed: int | None = None
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ContractError(
                f"SamplingParams.temperature: must be >= 0 (0 = greedy), got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ContractError(f"SamplingParams.top_p: must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise ContractError(f"SamplingParams.max_tokens: must be >= 1, got {self.max_tokens}")
        if self.n < 1:
            raise ContractError(f"SamplingParams.n: must be >= 1, got {self.n}")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))


@dataclass(frozen=True)
class GenerationRequest:
    """``prompt_ids`` is always the full context (the backend finds what it has cached of it)."""

    prompt_ids: tuple[int, ...]
    params: SamplingParams = SamplingParams()

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt_ids", tuple(int(t) for t in self.prompt_ids))
        if not self.prompt_ids:
            raise ContractError("GenerationRequest.prompt_ids: must be non-empty")


# The LoRA adapter of the memory writer where a run trains one adapter per role (``train.role_adapters:
# per_role``); PEFT's ``default`` plays the answer role.
MEMORY_ADAPTER = "memory"


class Capability(enum.Enum):
    """What a backend offers beyond :class:`PolicyClient` (each value says what), listed in its ``capabilities``.

    * ``ADAPTERS``: ``use_adapter(name)`` is a context manager; calls inside it generate and score with LoRA
      adapter ``name`` (a role's own), or with the default one where no adapter has that name.
    * ``DRAFT_CHECK``: ``greedy_logprobs(sequences)`` returns, per (prompt, draft), the draft tokens' log-probs,
      the argmax token at each draft position and its log-prob, from one forward.
    * ``WEIGHT_DIGEST``: ``weights_digest(adapter)`` returns a digest of the weights a greedy reply depends on
      (the base and that adapter); the write cache keys replies by it.
    """

    ADAPTERS = "a LoRA adapter per role, chosen per call (use_adapter)"
    DRAFT_CHECK = "a draft's log-probs and argmax tokens from one forward (greedy_logprobs)"
    WEIGHT_DIGEST = "a digest of its weights (weights_digest)"


def capabilities(client: Any) -> frozenset[Capability]:
    return frozenset(getattr(client, "capabilities", ()))


def require(client: Any, capability: Capability, needed_by: str) -> None:
    """Raise :class:`~memrl.policy.errors.PolicyError` naming the backend where it lacks ``capability``."""
    if capability in capabilities(client):
        return
    has = ", ".join(sorted(c.name for c in capabilities(client))) or "none"
    raise PolicyError(
        f"{needed_by} needs {capability.value}; policy backend {type(client).__name__} does not offer it "
        f"(it offers: {has}). Backends that do: hf, vllm"
    )


def role_scope(client: Any, adapter: str) -> contextlib.AbstractContextManager[None]:
    """Calls inside generate with ``adapter`` where the client serves adapters per call, else as they are."""
    if Capability.ADAPTERS in capabilities(client):
        return client.use_adapter(adapter)
    return contextlib.nullcontext()


@contextlib.contextmanager
def adapter_active(model: Any, name: str):
    """PEFT adapter ``name`` active inside the block (PEFT runs, and trains, only the active one), the previous
    one after. A model without that adapter (one shared LoRA, a bare model) is left as it is."""
    if name not in getattr(model, "peft_config", {}) or model.active_adapter == name:
        yield
        return
    previous = model.active_adapter
    _unfold(model)
    model.set_adapter(name)
    try:
        yield
    finally:
        _unfold(model)
        model.set_adapter(previous)


def _unfold(model: Any) -> None:
    """Unfold a LoRA adapter the policy folded in for decoding (memrl.policy.engine.lora_merge) before PEFT switches
    adapters: PEFT would unmerge it by subtraction, with a warning, and not exactly in bfloat16."""
    fold = getattr(model, "memrl_lora_fold", None)
    if fold is not None:
        fold.unfold()


@runtime_checkable
class PolicyClient(Protocol):
    """What the rest of memrl needs from a policy backend."""

    tokenizer: Any  # a transformers tokenizer (chat template, encode/decode)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[list[GenerationOutput]]:
        """One batched call; returns, per request, ``params.n`` outputs."""
        ...

    def logprobs(self, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]) -> list[list[float]]:
        """Training-time scoring: log p(response_i | prompt, response_<i) for each (prompt_ids, response_ids)."""
        ...
