"""LoRA adapters with PEFT: attach, save in standard PEFT format, reload.

The adapter directory written by :func:`save_adapter` is what ``PeftModel.from_pretrained(base, path)`` and
vLLM's ``LoRARequest`` read (``adapter_config.json`` + ``adapter_model.safetensors``). Only adapter weights are
trainable; the base weights stay frozen, and the same module with the adapter disabled is the reference policy.

With ``train.role_adapters: per_role`` the model carries a second adapter, :data:`MEMORY_ADAPTER`, for its memory
writes: PEFT saves it in the ``memory/`` subfolder of the same directory, so one path names both (the answer
adapter, PEFT's ``default``, stays at the top, where any PEFT reader finds it). :func:`use_adapter` makes one
active around a forward; with one adapter it does nothing, so callers name the role's adapter either way.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model, set_peft_model_state_dict
from peft.utils import get_peft_model_state_dict

from memrl.policy.base import MEMORY_ADAPTER, adapter_active
from memrl.train.config import LoraConfig

logger = logging.getLogger(__name__)

# PEFT's name for the first adapter: the answer role's (both roles' when shared).
DEFAULT_ADAPTER = "default"


def adapter_for(model: torch.nn.Module, role: str | None) -> str:
    """The adapter that plays ``role`` on ``model``: the writer's own where the model has one, else the default."""
    if role == "memory" and MEMORY_ADAPTER in getattr(model, "peft_config", {}):
        return MEMORY_ADAPTER
    return DEFAULT_ADAPTER


use_adapter = adapter_active  # a role's adapter active around a forward and backward


def attach_lora(model: torch.nn.Module, cfg: LoraConfig, per_role: bool = False) -> PeftModel:
    """Wrap ``model`` with a fresh LoRA adapter (``B`` initialised to 0, so the policy starts unchanged), and with
    ``per_role`` a second one for memory writes (:data:`MEMORY_ADAPTER`, same shape).

    A model that already is a :class:`PeftModel` is returned as is (its adapter keeps training).
    """
    if isinstance(model, PeftModel):
        return model
    targets: str | list[str] = (
        "all-linear" if cfg.target_modules == ["all-linear"] else list(cfg.target_modules)
    )
    peft_cfg = PeftLoraConfig(
        r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, target_modules=targets, task_type="CAUSAL_LM"
    )
    peft_model = get_peft_model(model, peft_cfg)
    if per_role:
        peft_model.add_adapter(MEMORY_ADAPTER, peft_cfg)
        peft_model.set_adapter(DEFAULT_ADAPTER)
    n_train = sum(p.numel() for p in trainable_parameters(peft_model))
    n_all = sum(p.numel() for p in peft_model.parameters())
    logger.info(
        "LoRA r=%d alpha=%d on %s%s: %d / %d params trainable", cfg.r, cfg.alpha, targets,
        " (one adapter per role)" if per_role else "", n_train, n_all,
    )  # fmt: skip
    return peft_model


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The adapter weights: every LoRA tensor, whichever adapter is active now (PEFT marks only the active
    adapter's as requiring grad, and the optimizer must hold both roles' from the start)."""
    params = [p for name, p in model.named_parameters() if p.requires_grad or ".lora_" in name]
    if not params:
        raise RuntimeError(
            "no trainable parameters: attach a LoRA adapter first (memrl.train.lora.attach_lora)"
        )
    return params


def save_adapter(model: PeftModel, path: str | Path) -> Path:
    """Write the adapter in standard PEFT format to ``path`` (a directory; the caller makes it atomic)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    return path


def load_adapter_weights(model: PeftModel, path: str | Path) -> None:
    """Load adapter weights saved by :func:`save_adapter` into an already wrapped ``model`` (resume)."""
    from safetensors.torch import load_file

    for name in getattr(model, "peft_config", {DEFAULT_ADAPTER: None}):
        file = Path(path) / ("" if name == DEFAULT_ADAPTER else name) / "adapter_model.safetensors"
        if not file.is_file():
            raise FileNotFoundError(
                f"{file}: no weights here for adapter {name!r} (expected a directory written by save_adapter)"
            )
        result = set_peft_model_state_dict(model, load_file(str(file)), adapter_name=name)
        missing = [
            k for k in getattr(result, "missing_keys", []) if f"lora_A.{name}" in k or f"lora_B.{name}" in k
        ]
        if missing:
            raise RuntimeError(f"{file}: adapter is missing {len(missing)} LoRA tensors, e.g. {missing[0]}")


def adapter_state(model: PeftModel, adapter: str = DEFAULT_ADAPTER) -> dict[str, torch.Tensor]:
    """A detached copy of one adapter's tensors (for change checks, and to restore with
    ``set_peft_model_state_dict``)."""
    state = get_peft_model_state_dict(model, adapter_name=adapter)
    return {k: v.detach().clone() for k, v in state.items()}


def lora_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every adapter's LoRA tensors, keyed by parameter name (both roles' adapters where the
    model has two): what :func:`lora_swapped` puts back in place."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if ".lora_" in name}


@contextlib.contextmanager
def lora_swapped(model: torch.nn.Module, tensors: dict[str, torch.Tensor]):
    """The LoRA tensors ``tensors`` (from :func:`lora_tensors`) in place inside the block, the model's own after.

    The copy is in place, so it must not run while a forward's graph still holds these parameters (their version
    changes): run it before the policy's forward, as the reference pass of a KL does."""
    params = dict(model.named_parameters())
    missing = sorted(set(tensors) - set(params))
    if missing:
        raise KeyError(f"lora_swapped: the model has no parameter {missing[0]} ({len(missing)} missing)")
    own = {name: params[name].detach().clone() for name in tensors}
    with torch.no_grad():
        for name, value in tensors.items():
            params[name].copy_(value)
    try:
        yield
    finally:
        with torch.no_grad():
            for name, value in own.items():
                params[name].copy_(value)


def saved_lora_tensors(model: PeftModel, path: str | Path) -> dict[str, torch.Tensor]:
    """The LoRA tensors of the adapter directory ``path`` (written by :func:`save_adapter` for this model's
    adapters), keyed as :func:`lora_tensors`; the model keeps its own weights."""
    with lora_swapped(model, lora_tensors(model)):  # the model's own tensors come back after the read
        load_adapter_weights(model, path)
        return lora_tensors(model)
