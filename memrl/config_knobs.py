"""Which config keys are stable knobs (with a line of help for ``memrl config show --all``) and which are kept
for experiments.

An experiment knob changes a measured trade-off that docs/experiments.md reports; a user reproducing or
extending a result rarely needs it. Every leaf key of :class:`memrl.config.Config` is in exactly one of
``STABLE`` and ``EXPERIMENT`` (tests/test_config.py checks it), so a new key has to say which it is.
"""

from __future__ import annotations

STABLE: dict[str, str] = {}

EXPERIMENT: dict[str, str] = {}


def describe(key: str) -> tuple[str, str]:
    """``(tier, help)`` of a dotted config key: tier ``stable``, ``experiment`` or ``""`` when unclassified."""
    if key in EXPERIMENT:
        return "experiment", EXPERIMENT[key]
    if key in STABLE:
        return "stable", STABLE[key]
    return "", ""
