"""Small decorator registries with one typed signature per registry and a dotted-path escape hatch.

    ADVANTAGES = Registry[AdvantageFn]("advantage estimator")

    @ADVANTAGES.register("grpo")
    def grpo(...): ...

    ADVANTAGES.get("grpo")                     # registered name
    ADVANTAGES.get("my_pkg.my_mod:my_adv")     # user code, imported once

Unknown names raise :class:`RegistryError` listing the valid choices; callers never branch on names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, kind: str, *, populate: Callable[[], None] | None = None) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._dotted: dict[str, T] = {}
        # Imports the modules that register built-ins, on first lookup (avoids import cycles at load time).
        self._populate = populate
        self._populated = populate is None

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise RegistryError(f"{self.kind} {name!r} is already registered to {self._items[name]!r}")
            self._items[name] = obj
            return obj

        return deco

    def _ensure(self) -> None:
        if not self._populated:
            self._populated = True
            assert self._populate is not None
            self._populate()

    def names(self) -> list[str]:
        self._ensure()
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        self._ensure()
        return name in self._items

    def get(self, name: str) -> T:
        self._ensure()
        if name in self._items:
            return self._items[name]
        if ":" in name:
            if name not in self._dotted:
                self._dotted[name] = _import_dotted(name, self.kind)
            return self._dotted[name]
        raise RegistryError(
            f"unknown {self.kind} {name!r}; valid choices: {', '.join(self.names()) or '(none)'}"
            " (or a dotted path 'package.module:attribute')"
        )


def _import_dotted(path: str, kind: str):
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RegistryError(f"{kind} {path!r}: cannot import module {module_name!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError as exc:
        raise RegistryError(f"{kind} {path!r}: module {module_name!r} has no attribute {attr!r}") from exc


def import_plugins(modules: list[str]) -> None:
    """Import each module of ``plugins:`` once (importing runs its ``@REGISTRY.register`` decorators)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise RegistryError(f"plugins: cannot import module {name!r}: {exc}") from exc
