"""Test doubles: stand-ins for the expensive or dangerous parts, for tests, benches and demos — not product features.

- :mod:`memrl.testing.models`: random-init tiny Llama models and a byte-level tokenizer built from code (real
  forward passes and KV caches, noise for text).
- :mod:`memrl.testing.scripted`: the ``scripted`` policy backend, a deterministic PolicyClient that writes what
  a script says (``policy.backend: scripted`` in configs).
- :mod:`memrl.testing.hostile`: hostile programs and the host-side checks that prove the sandbox held.

    from memrl.testing import random_tiny_llama
    model, tokenizer = random_tiny_llama()
"""

from memrl.testing.models import CHAT_TEMPLATE, byte_tokenizer, random_tiny_llama, tiny_llama_config

__all__ = ["CHAT_TEMPLATE", "byte_tokenizer", "random_tiny_llama", "tiny_llama_config"]
