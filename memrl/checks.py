"""Field checks the contracts of :mod:`memrl.types` run on creation.

A failed check raises :class:`ContractError` naming ``Type.field`` and the rule it broke, so a bad record is
caught where it is built, not where a later stage trips over it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any


class ContractError(ValueError):
    """A contract was built with an invalid field. The message names the type, the field and the rule."""


def fail(obj: object, name: str, why: str) -> None:
    raise ContractError(f"{type(obj).__name__}.{name}: {why}")


def as_tuple(obj: object, name: str, value: Any, item_type: type | tuple[type, ...] | None = None) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        # numpy arrays / tensors are not Sequences; accept anything with tolist().
        if hasattr(value, "tolist"):
            value = value.tolist()
        else:
            fail(obj, name, f"expected a sequence, got {type(value).__name__}")
    out = tuple(value)
    # Fast path for token ids (hundreds per output, every generate call): `type(x) is int` also rejects bool.
    if item_type is int and all(type(x) is int for x in out):
        item_type = None
    if item_type is not None:
        for i, item in enumerate(out):
            if not isinstance(item, item_type) or isinstance(item, bool) and item_type is int:
                fail(obj, name, f"item {i} is {type(item).__name__}, expected {item_type}")
    object.__setattr__(obj, name, out)
    return out


def require_str(obj: object, name: str, value: Any, *, non_empty: bool = True) -> None:
    if not isinstance(value, str):
        fail(obj, name, f"expected str, got {type(value).__name__}")
    if non_empty and not value.strip():
        fail(obj, name, "must be a non-empty string")


def optional_number(
    obj: object, name: str, value: Any, low: float = -math.inf, high: float = math.inf
) -> None:
    if value is None:
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not low <= value <= high:
        fail(obj, name, f"expected None or a number in [{low}, {high}], got {value!r}")
    object.__setattr__(obj, name, float(value))


def require_count(obj: object, name: str, value: Any, low: int = 0) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        fail(obj, name, f"expected an int >= {low}, got {value!r}")


def enum_field(obj: object, name: str, cls: type[enum.Enum]) -> None:
    value = getattr(obj, name)
    try:
        object.__setattr__(obj, name, cls(value))
    except ValueError:
        fail(obj, name, f"expected one of {[m.value for m in cls]}, got {value!r}")


def freeze_mapping(obj: object, name: str, value: Any) -> None:
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        fail(obj, name, f"expected a mapping, got {type(value).__name__}")
    object.__setattr__(obj, name, dict(value))
