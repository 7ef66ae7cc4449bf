"""Nested config dataclasses, loaded from YAML with verl-style ``key=value`` overrides.

Each component owns its sub-config dataclass (``memrl/<component>/config.py``) and is handed only that
sub-config. Unknown keys are rejected with the list of valid keys at that level, so a typo never silently
falls back to a default.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from memrl.data.config import DataConfig
from memrl.episode.config import EpisodeConfig
from memrl.memory.config import MemoryConfig
from memrl.policy.config import PolicyConfig
from memrl.rollout.config import RolloutConfig
from memrl.tools.config import ToolsConfig
from memrl.train.config import TrainConfig


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and what is valid."""


@dataclass
class Config:
    """Root config. ``output_dir`` receives trajectories, metrics and checkpoints."""

    seed: int = 0
    output_dir: str = "runs/default"
    data: DataConfig = field(default_factory=DataConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _check_keys(node: Any, cls: type, where: str, source: str) -> None:
    """Reject keys that ``cls`` does not define, recursively through nested dataclasses."""
    if not isinstance(node, (dict, DictConfig)):
        return
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    for key in node:
        if key not in valid:
            prefix = f"{where}." if where else ""
            raise ConfigError(
                f"{source}: unknown config key '{prefix}{key}'; valid keys"
                f"{' under ' + repr(where) if where else ''}: {', '.join(valid)}"
            )
        if _is_dataclass_type(hints[key]):
            _check_keys(node[key], hints[key], f"{where}.{key}" if where else str(key), source)


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (), cls: type = Config) -> Any:
    """Build a ``cls`` instance: dataclass defaults ← YAML file ← ``key=value`` overrides.

    >>> cfg = load_config(None, ["rollout.n=8", "policy.temperature=0.7"])
    """
    merged = OmegaConf.structured(cls)
    layers: list[tuple[str, Any]] = []
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        try:
            layers.append((str(p), OmegaConf.load(p)))
        except Exception as exc:  # yaml errors come in many types; report them uniformly
            raise ConfigError(f"{p}: cannot parse YAML: {exc}") from exc
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. rollout.n=8")
    if overrides:
        layers.append(("command-line overrides", OmegaConf.from_dotlist(list(overrides))))
    for source, layer in layers:
        _check_keys(OmegaConf.to_container(layer, resolve=False), cls, "", source)
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{source}: {exc}") from exc
    try:
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {exc}") from exc


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
