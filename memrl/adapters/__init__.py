"""Built-in dataset adapters, one module each: ``synthetic``, ``locomo``, ``longmemeval``, ``chats`` (held out).

Each module registers one adapter in :data:`memrl.data.adapters.ADAPTERS` (the contract, helpers and registry
live there; the registry imports these modules on its first lookup). ``FIXTURES`` holds small samples of the
real formats, shipped as package data, so tests and examples run without the full datasets.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LOCOMO_FIXTURE = FIXTURES / "locomo_mini.json"
LONGMEMEVAL_FIXTURE = FIXTURES / "longmemeval_mini.json"
CHATS_FIXTURE = FIXTURES / "chats_mini.json"
