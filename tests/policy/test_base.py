"""The capabilities a backend declares beyond the PolicyClient contract, and the error where one is missing."""

from __future__ import annotations

import pytest

from memrl.policy.backends.openai import OpenAIPolicy
from memrl.policy.base import Capability, capabilities, require, role_scope
from memrl.policy.engine.hf import HFPolicy
from memrl.policy.errors import PolicyError
from memrl.testing.scripted import ScriptedPolicy


def test_the_engines_declare_every_capability_and_a_plain_client_none():
    assert capabilities(HFPolicy) == frozenset(Capability)
    assert capabilities(ScriptedPolicy) == frozenset()
    assert capabilities(OpenAIPolicy) == frozenset()


def test_a_missing_capability_names_the_backend_what_it_lacks_and_who_asked():
    client = ScriptedPolicy(tokenizer=None, script=lambda prompt: "")
    with pytest.raises(PolicyError) as err:
        require(client, Capability.ADAPTERS, "train.role_adapters=per_role")
    msg = str(err.value)
    assert "train.role_adapters=per_role needs a LoRA adapter per role" in msg
    assert "ScriptedPolicy does not offer it (it offers: none)" in msg and "hf, vllm" in msg


class _Adapters:
    capabilities = frozenset({Capability.ADAPTERS})

    def __init__(self) -> None:
        self.active = "default"

    def use_adapter(self, name):
        import contextlib

        @contextlib.contextmanager
        def scope():
            before, self.active = self.active, name
            yield
            self.active = before

        return scope()


def test_role_scope_switches_only_a_client_that_serves_adapters():
    client = _Adapters()
    require(client, Capability.ADAPTERS, "x")  # no error
    with role_scope(client, "memory"):
        assert client.active == "memory"
    assert client.active == "default"
    plain = ScriptedPolicy(tokenizer=None, script=lambda prompt: "")
    with role_scope(plain, "memory"):  # a shared adapter: the policy as it is
        pass
