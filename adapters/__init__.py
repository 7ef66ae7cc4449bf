"""Built-in dataset adapters (installed as ``memrl_adapters``; PyPI's ``adapters`` is AdapterHub).

Each module registers one adapter in :data:`memrl.data.adapters.ADAPTERS`: ``synthetic``, ``locomo``,
``longmemeval``. ``FIXTURES`` holds small samples of the real formats so tests run without the full data.
"""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LOCOMO_FIXTURE = FIXTURES / "locomo_mini.json"
LONGMEMEVAL_FIXTURE = FIXTURES / "longmemeval_mini.json"
