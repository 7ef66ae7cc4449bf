"""Registers the built-in backends. Each constructor imports its heavy dependency only when called, so
``vllm`` (an optional extra) is never imported unless ``backend: vllm`` is chosen."""

from __future__ import annotations

from memrl.policy import BACKENDS
from memrl.policy.base import PolicyClient
from memrl.policy.config import PolicyConfig


@BACKENDS.register("hf")
def hf_backend(cfg: PolicyConfig) -> PolicyClient:
    from memrl.policy.engine.hf import HFPolicy

    return HFPolicy(cfg)


@BACKENDS.register("vllm")
def vllm_backend(cfg: PolicyConfig) -> PolicyClient:
    from memrl.policy.backends.vllm import VLLMPolicy

    return VLLMPolicy(cfg)


@BACKENDS.register("openai")
def openai_backend(cfg: PolicyConfig) -> PolicyClient:
    from memrl.policy.backends.openai import OpenAIPolicy

    return OpenAIPolicy(cfg)
