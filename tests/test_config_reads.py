"""Every config key is read by some code outside the config modules, and every old key names its successor.

A key that is validated, documented and set by recipes but read by no code is worse than a missing one: the user
turns it and nothing happens. The check is static (an AST walk of ``memrl/``): ``a.b.c`` counts as read when some
module outside the config modules reads the attribute ``.c`` (or ``getattr(x, "c")``). A name that two
config sections share (``rollout.temperature``, ``SamplingParams.temperature``) counts for a section only when it
is read inside that section's package (``memrl/rollout/``), or through the section's own name
(``cfg.rollout.temperature``), since each component is handed only its own sub-config; a root key (``seed``)
counts wherever it is read, as the root config is held by many modules.
"""

from __future__ import annotations

import ast
import dataclasses
import typing
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

import memrl
from memrl.config import REMOVED, RENAMED, Config, ConfigError, load_config

ROOT = Path(memrl.__file__).parent
CONFIG_MODULES = {ROOT / "config.py", ROOT / "config_knobs.py", *ROOT.glob("*/config.py")}


def leaves(cls: type, prefix: str = "") -> list[str]:
    """Dotted leaf keys of a config dataclass (nested dataclasses recursed, anything else a leaf)."""
    hints = typing.get_type_hints(cls)
    keys: list[str] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            keys += leaves(tp, f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


@dataclass
class Reads:
    """Attribute names read per package (``memrl.rollout`` → {...}) and ``parent.name`` attribute chains."""

    by_package: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    chains: set[str] = field(default_factory=set)

    def anywhere(self, name: str) -> bool:
        return any(name in names for names in self.by_package.values())


def reads(root: Path = ROOT, skip: set[Path] = CONFIG_MODULES) -> Reads:
    out = Reads()
    for path in sorted(root.rglob("*.py")):
        if path in skip:
            continue
        package = ".".join(path.relative_to(root.parent).parts[:2])
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                out.by_package[package].add(node.attr)
                if isinstance(node.value, ast.Attribute):
                    out.chains.add(f"{node.value.attr}.{node.attr}")
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "getattr"
                and len(node.args) >= 2
                and isinstance(node.args[1], ast.Constant)
            ):
                out.by_package[package].add(str(node.args[1].value))
    return out


def unread(cls: type, found: Reads) -> list[str]:
    """The leaf keys of ``cls`` that no code reads (rules in the module docstring)."""
    keys = leaves(cls)
    owners: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        owners[key.rpartition(".")[2]].append(key)
    missing = []
    for key in keys:
        parent, _, name = key.rpartition(".")
        if len(owners[name]) == 1 or not parent:
            ok = found.anywhere(name)
        else:
            section = key.split(".")[0]
            ok = (
                name in found.by_package.get(f"memrl.{section}", set())
                or f"{parent.rpartition('.')[2]}.{name}" in found.chains
            )
        if not ok:
            missing.append(key)
    return missing


def test_every_config_key_is_read_by_code_outside_the_config_modules():
    assert unread(Config, reads()) == []


@dataclass
class _PlantedPolicy:
    backend: str = "hf"
    nobody_reads_this: int = 3


@dataclass
class _PlantedRollout:
    temperature: float = 1.0


@dataclass
class _Planted:
    policy: _PlantedPolicy = field(default_factory=_PlantedPolicy)
    rollout: _PlantedRollout = field(default_factory=_PlantedRollout)
    seed: int = 0


def test_the_check_finds_a_planted_dead_key_and_a_shared_name_read_only_elsewhere(tmp_path):
    pkg = tmp_path / "memrl"
    (pkg / "policy").mkdir(parents=True)
    (pkg / "rollout").mkdir()
    (pkg / "policy" / "client.py").write_text("def make(cfg):\n    return cfg.backend, cfg.seed\n")
    # ``temperature`` is read, but only in the policy package: the rollout section's key is still dead.
    (pkg / "policy" / "sample.py").write_text("def t(params):\n    return params.temperature\n")
    found = reads(pkg, skip=set())
    assert unread(_Planted, found) == ["policy.nobody_reads_this"]  # temperature: unique name, read somewhere

    @dataclass
    class _Shared(_Planted):
        temperature: float = 0.0  # now two config levels share the name

    assert unread(_Shared, found) == ["policy.nobody_reads_this", "rollout.temperature"]
    (pkg / "rollout" / "engine.py").write_text("def t(self):\n    return self.cfg.temperature\n")
    assert unread(_Shared, reads(pkg, skip=set())) == ["policy.nobody_reads_this"]


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_a_renamed_key_names_its_successor(old, tmp_path):
    new = RENAMED[old].split()[0]
    assert new in leaves(Config), f"RENAMED[{old!r}] points at {new!r}, which is not a config key"
    assert old not in leaves(Config)
    nested: object = 1
    for part in reversed(old.split(".")):
        nested = {part: nested}
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(nested))
    with pytest.raises(ConfigError, match=f"'{old}' is now '{new}'") as err:
        load_config(path)
    assert str(path.name) in str(err.value)
    with pytest.raises(ConfigError, match=f"command-line overrides: config key '{old}' is now '{new}'"):
        load_config(None, [f"{old}=1"])


@pytest.mark.parametrize("old", sorted(REMOVED))
def test_a_removed_key_says_what_to_use_instead(old):
    assert old not in leaves(Config)
    with pytest.raises(ConfigError, match=f"'{old}' was removed; {REMOVED[old][:20]}"):
        load_config(None, [f"{old}=1"])
