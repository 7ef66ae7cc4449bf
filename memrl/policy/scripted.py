"""The ``scripted`` backend lives in :mod:`memrl.testing.scripted`, with the other test doubles; this module keeps
``memrl.policy.scripted`` imports working."""

from memrl.testing.scripted import (
    DEFAULT_LOGPROB,
    DEMO_SCRIPT,
    PrefixHandleError,
    ScriptContext,
    ScriptedPolicy,
    ScriptedStats,
    ScriptedTurn,
    random_script,
    scripted_backend,
)

__all__ = [
    "DEFAULT_LOGPROB",
    "DEMO_SCRIPT",
    "PrefixHandleError",
    "ScriptContext",
    "ScriptedPolicy",
    "ScriptedStats",
    "ScriptedTurn",
    "random_script",
    "scripted_backend",
]
