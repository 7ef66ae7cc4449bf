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

An adapter switch keeps the folded weights it leaves (:meth:`LoraFold.unfold`): the writer's adapter, switched on
and off around each of thousands of per-turn writes, is folded once per weight version, and each switch after
that points the layers at its folded weights (no copy, no arithmetic). Each kept adapter costs one more copy of
the wrapped layers' weights. A kept fold is reused only while its adapter's LoRA tensors are the ones it was
folded from (their in-place version counters unchanged); a weight update (:meth:`LoraFold.restore`) drops them all.
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
        # LoRA on a plain weight matrix folds; PEFT's ParamWrapper (LoRA on a mixture of experts' stacked expert
        # weights, which all-linear targets in MoE families) keeps its unmerged path, per layer, which is exact.
        self.layers = [layer for layer in lora_layers(model) if _foldable(layer)]
        self._stash: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self.folded: str | None = None  # the adapter folded in now
        # adapter → (the version of its LoRA tensors, its folded (weight, bias) per layer): folds kept by unfold()
        self._kept: dict[str, tuple[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor | None]]]] = {}
        self.folds = 0  # folds computed (a kept fold that is reused is not one)
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
        """The base weights back, and every kept fold dropped (the LoRA weights change next): the model is PEFT's
        unmerged LoRA model again."""
        self._kept.clear()
        self.unfold()

    def unfold(self) -> None:
        """The base weights back, keeping the fold that was in (an adapter switch): the model is PEFT's unmerged
        LoRA model again."""
        if self.folded is None:
            return
        with torch.inference_mode(False), torch.no_grad():
            for layer, (weight, bias) in zip(self.layers, self._stash, strict=True):
                base = layer.get_base_layer()
                base.weight.data = weight
                if bias is not None:
                    base.bias.data = bias
                layer.merged_adapters.clear()
        self.folded = None

    def _ensure_folded(self) -> None:
        active = _active_adapter(self.model)
        if active == self.folded and self.layers[0].merged:
            return
        self.unfold()
        if active is None or any(layer.disable_adapters for layer in self.layers):
            return  # the bare base runs (adapters disabled): nothing to fold
        version = self._version(active)
        kept = self._kept.get(active)
        with torch.inference_mode(False), torch.no_grad():
            if not self._stash:
                self._stash = [_base_tensors(layer) for layer in self.layers]
            if kept is not None and version is not None and kept[0] == version:
                for layer, (weight, bias) in zip(self.layers, kept[1], strict=True):
                    base = layer.get_base_layer()
                    base.weight.data = weight
                    if bias is not None:
                        base.bias.data = bias
                    layer.merged_adapters.append(active)
            else:
                for layer, (weight, bias) in zip(self.layers, self._stash, strict=True):
                    base = layer.get_base_layer()  # a fresh copy of the base weights to fold into
                    base.weight.data = weight.clone()
                    if bias is not None:
                        base.bias.data = bias.clone()
                    layer.merge()  # PEFT's own fold of the layer's active adapter (LoRA, DoRA, fan-in-fan-out)
                self._kept[active] = (version, [_base_tensors(layer) for layer in self.layers])
                self.folds += 1
        self.folded = active

    def _version(self, adapter: str) -> tuple[int, ...] | None:
        """Changes whenever a LoRA tensor of ``adapter`` is written in place (an optimizer step, a state load);
        None where a tensor keeps no version (made under inference mode): such a fold is never reused."""
        marker = f".{adapter}."
        try:
            return tuple(
                v for name, p in self.model.named_parameters() if "lora_" in name and marker in name
                for v in (p._version, p.data_ptr())
            )  # fmt: skip
        except RuntimeError:
            return None

    def _guard(self, module: Any, args: Any) -> None:
        if self._inside == 0 and self.folded is not None:
            self.restore()


def _active_adapter(model: Any) -> str | None:
    name = getattr(model, "active_adapter", None)
    return name if isinstance(name, str) else None


def _foldable(layer: Any) -> bool:
    base = layer.get_base_layer()
    return isinstance(getattr(base, "weight", None), torch.Tensor) and type(layer).__name__ != "ParamWrapper"


def _base_tensors(layer: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The tensors the layer's base weight and bias hold now (not copies: folds go into fresh tensors)."""
    base = layer.get_base_layer()
    bias = base.bias.data if getattr(base, "bias", None) is not None else None
    return base.weight.data, bias
