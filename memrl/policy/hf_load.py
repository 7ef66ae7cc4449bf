"""Loading the HF backend's model: the checkpoint in the precision the device calls for, and its LoRA adapters."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from memrl.policy.base import MEMORY_ADAPTER
from memrl.policy.config import PolicyConfig
from memrl.policy.errors import PolicyError
from memrl.policy.models import MODEL_ALIASES, policy_dtype, resolve_model_path

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model_and_tokenizer(cfg: PolicyConfig):
    """Load ``cfg.model`` (alias, path or hub id) in the precision ``cfg.dtype`` resolves to on ``cfg.device``
    and, if ``cfg.lora_path`` is set, attach that PEFT adapter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(cfg.model)
    dtype = policy_dtype(cfg)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=_DTYPES[dtype], attn_implementation=cfg.attn_implementation
        )
    except OSError as exc:
        raise PolicyError(
            f"policy.model={cfg.model!r}: cannot load a causal LM from {path!r} ({exc}); give a local model "
            f"directory, a hub id available offline, or an alias ({', '.join(sorted(MODEL_ALIASES))})"
        ) from exc
    logger.info("policy %s (%s) in %s on %s", cfg.model, path, dtype, cfg.device)
    if cfg.lora_path:
        model = attach_adapter(model, cfg.lora_path)
    return model.to(cfg.device).eval(), tokenizer


def attach_adapter(model, path: str):
    """``path``'s adapter, and its writer's adapter when it has one (PEFT saves it in the ``memory/`` subfolder)."""
    from peft import PeftModel

    if not (Path(path) / "adapter_config.json").is_file():
        raise PolicyError(
            f"policy.lora_path={path!r}: no adapter_config.json there (expected a PEFT adapter dir)"
        )
    model = PeftModel.from_pretrained(model, path, is_trainable=False)
    if (Path(path) / MEMORY_ADAPTER / "adapter_config.json").is_file():
        model.load_adapter(str(Path(path) / MEMORY_ADAPTER), adapter_name=MEMORY_ADAPTER, is_trainable=False)
    return model
