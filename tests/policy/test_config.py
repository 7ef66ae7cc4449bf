"""``policy.backend: vllm|hf``: a recipe names the engine its workload runs fastest on, first, where installed."""

from __future__ import annotations

import importlib.util
import logging

import pytest

from memrl.config import load_config
from memrl.policy.config import PolicyConfig


def test_the_first_installed_backend_is_taken_and_the_fallback_logged(monkeypatch, caplog):
    installed = importlib.util.find_spec("vllm") is not None
    with caplog.at_level(logging.INFO, logger="memrl.policy.config"):
        cfg = load_config(None, ["policy.backend=vllm|hf"])
    assert cfg.policy.backend == ("vllm" if installed else "hf")
    assert installed or "vllm is not installed, using hf" in caplog.text
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # as if vllm were installed
    assert PolicyConfig(backend="vllm|hf").backend == "vllm"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert PolicyConfig(backend="vllm|hf").backend == "hf"
    assert PolicyConfig(backend="hf").backend == "hf"
    with pytest.raises(ValueError, match="none of these is installed"):
        PolicyConfig(backend="vllm|vllm")
