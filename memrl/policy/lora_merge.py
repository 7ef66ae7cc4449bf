"""Decode with the active LoRA adapter folded into the base weights, and the trainer still sees an unmerged model.

A PEFT LoRA layer runs ``base(x) + B(A(dropout(x))) * scale``: four extra small operations on each wrapped linear
layer (210 of them in SmolLM2-135M with LoRA on every linear layer), every decode step. At this model size a decode
step is bound by those launches, not by arithmetic, so folding ``B @ A * scale`` into the base weight once per
weight version makes each step as cheap as the bare model's (measured in docs/benchmarks.md).

The fold is undone by copying the stashed base weights back, never by subtracting the delta: ``W + d - d`` is not
``W`` in bfloat16, and the error would grow with every rollout. The stash costs one copy of the wrapped layers'
weights. It is undone:

* before any forward the policy did not issue itself (a forward pre-hook on the model): the trainer shares the
  module, and its loss needs the unmerged LoRA path for gradients, its reference log-probs the bare base;
* when the weights change (:meth:`restore` from ``HFPolicy.invalidate_cache``, which every weight update calls);
* when the policy generates with another adapter active (the memory writer's, say), which is then folded instead.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def lora_layers(model: Any) -> list[Any]:
    """The PEFT LoRA layers of ``model`` (none for a bare model)."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft is a dependency; a bare transformers model has nothing to fold anyway
        return []
    return [m for m in model.modules() if isinstance(m, LoraLayer)]


class LoraFold:
    """Folds ``model``'s active LoRA adapter into its base weights for the policy's own forwards."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.layers = lora_layers(model)
        self._stash: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.folded: str | None = None  # the adapter folded in now
        self._inside = 0  # > 0 while the policy's own forward runs
        if self.layers:
            model.register_forward_pre_hook(self._guard)
        model.memrl_lora_fold = self  # adapter switches (memrl.policy.base.adapter_active) unfold first

    @contextlib.contextmanager
    def forward(self):
        """The policy's forward runs inside: the active adapter is folded in first (once per weight version)."""
        if self.layers and self._inside == 0:
            self._ensure_folded()
        self._inside += 1
        try:
            yield
        finally:
            self._inside -= 1

    def restore(self) -> None:
        """Copy the stashed base weights back: the model is PEFT's unmerged LoRA model again."""
        if self.folded is None:
            return
        with torch.inference_mode(False), torch.no_grad():
            for layer, (weight, bias) in zip(self.layers, self._stash, strict=True):
                base = layer.get_base_layer()
                base.weight.copy_(weight)
                if bias is not None:
                    base.bias.copy_(bias)
                layer.merged_adapters.clear()
        self.folded = None

    def _ensure_folded(self) -> None:
        active = _active_adapter(self.model)
        if active == self.folded and self.layers[0].merged:
            return
        self.restore()
        if active is None or any(layer.disable_adapters for layer in self.layers):
            return  # the bare base runs (adapters disabled): nothing to fold
        with torch.inference_mode(False), torch.no_grad():
            if not self._stash:
                self._stash = [_copy_base(layer) for layer in self.layers]
            for layer in self.layers:
                layer.merge()  # PEFT's own fold of the layer's active adapter (LoRA, DoRA, fan-in-fan-out)
        self.folded = active

    def _guard(self, module: Any, args: Any) -> None:
        if self._inside == 0 and self.folded is not None:
            self.restore()


def _active_adapter(model: Any) -> str | None:
    name = getattr(model, "active_adapter", None)
    return name if isinstance(name, str) else None


def _copy_base(layer: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    base = layer.get_base_layer()
    bias = base.bias.detach().clone() if getattr(base, "bias", None) is not None else None
    return base.weight.detach().clone(), bias
