"""Policy backends: ``BACKENDS`` maps a name to a ``(PolicyConfig) -> PolicyClient`` constructor.

>>> policy = make_policy(PolicyConfig(backend="hf", model="smollm2-135m"))
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from memrl.policy.base import GenerationRequest, PolicyClient, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.errors import PolicyError, PolicyHTTPError
from memrl.registry import Registry

BackendFactory = Callable[[PolicyConfig], PolicyClient]

_BACKEND_MODULES = ("memrl.policy.backends", "memrl.testing.scripted")


def _populate() -> None:
    for module in _BACKEND_MODULES:
        importlib.import_module(module)


BACKENDS: Registry[BackendFactory] = Registry("policy backend", populate=_populate)


def make_policy(cfg: PolicyConfig) -> PolicyClient:
    """Build the backend ``cfg.backend`` names (registered name or ``package.module:factory``)."""
    return BACKENDS.get(cfg.backend)(cfg)


__all__ = [
    "BACKENDS",
    "GenerationRequest",
    "PolicyClient",
    "PolicyConfig",
    "PolicyError",
    "PolicyHTTPError",
    "SamplingParams",
    "make_policy",
]
