"""Loading the HF backend's model: the checkpoint in the precision the device calls for, its LoRA adapters, and
what the engine reads off the loaded model (pad and eos ids, its length, its attention implementation)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from memrl.policy.base import MEMORY_ADAPTER
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.architecture import text_config
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


def attention_implementation(model) -> str | None:
    """The attention implementation the (possibly PEFT-wrapped) model runs."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base.config, "_attn_implementation", None)


def enable_shared_attention(model) -> bool:
    """Switch an sdpa model to ``memrl_sdpa`` (identical unless a shared prefix is passed); False when the model
    uses another attention implementation (e.g. flash attention on GPU), which then keeps per-row copies."""
    from memrl.policy.engine.shared_attention import IMPLEMENTATION, register

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    current = attention_implementation(model)
    if current == IMPLEMENTATION:
        return True
    if current != "sdpa" or not hasattr(base, "set_attn_implementation"):
        return False
    base.set_attn_implementation(register())
    return True


def pad_id(tokenizer) -> int:
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if tid is not None:
            return int(tid)
    return 0


def eos_ids(model, tokenizer) -> list[int]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(int(t) for t in gen_eos)
    return sorted(ids)


def model_max_len(model) -> int:
    cfg = text_config(model.config)
    return int(getattr(cfg, "max_position_embeddings", None) or 1 << 30)
