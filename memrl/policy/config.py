from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PolicyConfig:
    """Which backend generates, with which model and sampling defaults (owned by memrl.policy).

    ``model = "tiny"`` is the embedded byte-level Llama built by ``memrl model tiny``; any HF causal-LM path or
    hub id works in its place.
    """

    backend: str = "hf"
    model: str = "tiny"
    lora_path: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    max_model_len: int = 4096
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    top_logprobs: int = 5
    base_url: str | None = None
