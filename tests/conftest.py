"""Shared fixtures. Keep each fixture small; add yours below with a one-line docstring."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_hf_policy():
    """A randomly initialised tiny byte-level Llama behind the HF PolicyClient (built in about a second).

    Shared across the session: do not change its weights; call ``release`` on prefix handles you keep.
    """
    from memrl.policy.config import PolicyConfig
    from memrl.policy.hf import HFPolicy
    from memrl.policy.tiny_arch import random_tiny_llama

    model, tokenizer = random_tiny_llama(seed=0)
    return HFPolicy.from_model(model, tokenizer, PolicyConfig(model="random-tiny", seed=0))
