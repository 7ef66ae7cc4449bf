"""LoRA adapters with PEFT: attach, save in standard PEFT format, reload.

The adapter directory written by :func:`save_adapter` is what ``PeftModel.from_pretrained(base, path)`` and
vLLM's ``LoRARequest`` read (``adapter_config.json`` + ``adapter_model.safetensors``). Only adapter weights are
trainable; the base weights stay frozen, and the same module with the adapter disabled is the reference policy.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model, set_peft_model_state_dict
from peft.utils import get_peft_model_state_dict

from memrl.train.config import LoraConfig

logger = logging.getLogger(__name__)


def attach_lora(model: torch.nn.Module, cfg: LoraConfig) -> PeftModel:
    """Wrap ``model`` with a fresh LoRA adapter (``B`` initialised to 0, so the policy starts unchanged).

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
    n_train = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    n_all = sum(p.numel() for p in peft_model.parameters())
    logger.info(
        "LoRA r=%d alpha=%d on %s: %d / %d params trainable", cfg.r, cfg.alpha, targets, n_train, n_all
    )
    return peft_model


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]
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

    file = Path(path) / "adapter_model.safetensors"
    if not file.is_file():
        raise FileNotFoundError(
            f"{file}: no adapter weights here (expected a directory written by save_adapter)"
        )
    result = set_peft_model_state_dict(model, load_file(str(file)))
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if missing:
        raise RuntimeError(f"{file}: adapter is missing {len(missing)} LoRA tensors, e.g. {missing[0]}")


def adapter_state(model: PeftModel) -> dict[str, torch.Tensor]:
    """A detached copy of the adapter tensors (for tests and change checks)."""
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}
