"""The LoRA adapters of one :class:`~memrl.policy.engine.hf.HFPolicy`: loading, switching and folding them.

* :meth:`LoraAdapters.load` / :meth:`LoraAdapters.set_state` swap adapter weights in place (from a PEFT adapter
  directory, or from a state dict a trainer hands over);
* :meth:`LoraAdapters.use` generates with another adapter (the memory writer's) from that adapter's own prefix
  cache: cached states hold one adapter's keys and values, never valid for another;
* :meth:`LoraAdapters.own_forward` folds the active adapter into the base weights around the policy's own forwards
  where ``policy.merge_lora`` is on (:mod:`memrl.policy.engine.lora_merge`).

The decode engine holds one :class:`LoraAdapters` and reaches it through its public methods (``load_adapter``,
``set_adapter_state``, ``use_adapter``, ``invalidate_cache``).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from memrl.policy.base import MEMORY_ADAPTER, adapter_active
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.load import attach_adapter
from memrl.policy.engine.lora_merge import LoraFold
from memrl.policy.engine.radix_cache import RadixCache
from memrl.policy.errors import PolicyError


class AdapterHost(Protocol):
    """What the adapters need from the policy (:class:`~memrl.policy.engine.hf.HFPolicy`, which imports this
    module): its model (replaced when an adapter is first attached), its active prefix cache (swapped per
    adapter) and its cache reset after a weight change."""

    cfg: PolicyConfig
    model: Any
    device: torch.device
    prefix_cache: RadixCache

    def invalidate_cache(self) -> None: ...


class LoraAdapters:
    """LoRA bookkeeping of one policy: the other adapters' prefix caches and the fold of the active one."""

    def __init__(self, policy: AdapterHost) -> None:
        self.policy = policy
        self.caches: dict[str, RadixCache] = {}  # the adapters' prefix caches while another one is in use
        self.fold: LoraFold | None = None  # see own_forward

    def load(self, path: str | Path) -> None:
        """Hot-swap LoRA weights from a PEFT adapter directory (attaching the adapter on first call)."""
        from peft import PeftModel, load_peft_weights

        policy = self.policy
        path = str(path)
        if not isinstance(policy.model, PeftModel):
            policy.model = attach_adapter(policy.model, path).to(policy.device).eval()
        else:
            self.set_state(load_peft_weights(path, device=str(policy.device)))
            if MEMORY_ADAPTER in policy.model.peft_config:
                writer = load_peft_weights(str(Path(path) / MEMORY_ADAPTER), device=str(policy.device))
                self.set_state(writer, MEMORY_ADAPTER)
        policy.invalidate_cache()

    def set_state(self, weights: Mapping[str, torch.Tensor], adapter: str = "default") -> None:
        """Load in-memory LoRA weights (PEFT state-dict names, as ``get_peft_model_state_dict`` returns)."""
        from peft import PeftModel, set_peft_model_state_dict

        policy = self.policy
        if not isinstance(policy.model, PeftModel):
            raise PolicyError("set_adapter_state: no LoRA adapter is attached; call load_adapter(path) first")
        result = set_peft_model_state_dict(policy.model, dict(weights), adapter_name=adapter)
        unexpected = list(getattr(result, "unexpected_keys", []) or [])
        if unexpected:
            raise PolicyError(
                f"adapter weights do not match the attached adapter; unexpected keys {unexpected[:5]}"
            )
        policy.invalidate_cache()

    def weights_changed(self) -> None:
        """Forget the other adapters' cached states and unfold: the LoRA weights changed, so the next forward
        folds them in anew (the policy clears its active prefix cache itself)."""
        for cache in self.caches.values():
            cache.clear()
        if self.fold is not None:
            self.fold.restore()

    def own_forward(self) -> contextlib.AbstractContextManager[None]:
        """Around the policy's own forwards: the active LoRA adapter folded into the base weights, where
        ``policy.merge_lora`` is on (:mod:`memrl.policy.engine.lora_merge`)."""
        if not self.policy.cfg.merge_lora:
            return contextlib.nullcontext()
        model = self.policy.model
        if self.fold is None or self.fold.model is not model:  # load() may wrap a new PeftModel
            # One fold per model: policies sharing a model (a benchmark's arms) each stashing "base" weights that
            # another had already folded would restore a folded model as the base, and fold the delta twice.
            shared = getattr(model, "memrl_lora_fold", None)
            self.fold = shared if shared is not None and shared.model is model else LoraFold(model)
        return self.fold.forward()

    @contextlib.contextmanager
    def use(self, name: str) -> Iterator[None]:
        """Generate with LoRA adapter ``name`` inside the block (a model without it is left as it is), from that
        adapter's own prefix cache. Per ``generate`` call: the runner writes memory and answers in separate phases."""
        policy = self.policy
        model = policy.model
        if name not in getattr(model, "peft_config", {}) or model.active_adapter == name:
            yield
            return
        cache = policy.prefix_cache
        self.caches.setdefault(model.active_adapter, cache)
        policy.prefix_cache = self.caches.setdefault(name, RadixCache(policy.cfg.prefix_cache_tokens))
        try:
            with adapter_active(model, name):
                yield
        finally:
            policy.prefix_cache = cache


_BASE_SLICE = 1 << 16  # embedding values hashed to tell base models apart (the whole matrix is ~100 MB)


def _tensor_bytes(t) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().numpy().tobytes()


def module_digest(model, adapter: str | None) -> str | None:
    """Hex digest of what a greedy write depends on in ``model``: its base (config + an embedding slice) and the
    LoRA tensors of ``adapter`` (None: no adapter). None for an object that is not a torch module."""

    if not isinstance(model, torch.nn.Module):
        return None
    h = hashlib.sha256()
    config = getattr(model, "config", None)
    h.update(config.to_json_string().encode() if hasattr(config, "to_json_string") else repr(config).encode())
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is not None:
        h.update(_tensor_bytes(embeddings.weight.reshape(-1)[:_BASE_SLICE]))
    if adapter is not None:
        marker = f".{adapter}."
        for name, param in sorted(model.named_parameters()):
            if "lora_" in name and marker in name:
                h.update(name.encode())
                h.update(_tensor_bytes(param))
    return h.hexdigest()
