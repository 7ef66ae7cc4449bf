"""Nested config dataclasses, loaded from YAML with verl-style ``key=value`` overrides.

Each component owns its sub-config dataclass (``memrl/<component>/config.py``) and is handed only that
sub-config. Unknown keys are rejected with the list of valid keys at that level, so a typo never silently
falls back to a default.

A config file may build on others: ``defaults: [base.yaml, arm.yaml]`` (paths relative to the file) are merged
first, in list order, then the file's own keys, then the command-line overrides. Each file is merged once, where
it first appears, so two arms over one base can be combined without the base undoing either.
``memrl config show FILE`` prints the result with the file each key came from.
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
from memrl.registry import RegistryError, import_plugins
from memrl.rollout.config import RolloutConfig
from memrl.tools.config import ToolsConfig
from memrl.train.config import TrainConfig

OVERRIDE_SOURCE = "override"
DEFAULT_SOURCE = "default"


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the key and what is valid."""


# Keys that were renamed or removed: a config still using one is told what to write instead.
RENAMED: dict[str, str] = {
    "memory.update_floor": "memory.update_min_cosine",
    "memory.add_ceiling": "memory.add_supersede_cosine",
    "episode.history_steps": "episode.record_history_turns (true for turn, false for none)",
    "data.batch.history_steps": "data.batch.untrained_steps",
    "tools.parser": "rollout.tool_parser",
}
REMOVED: dict[str, str] = {
    "policy.temperature": "sampling is set per rollout: use rollout.temperature",
    "policy.top_p": "sampling is set per rollout: use rollout.top_p",
    "policy.max_tokens": "reply lengths are set per rollout: use rollout.max_response_tokens",
    "memory.dense_weight": "hybrid retrieval fuses ranks with fixed weights (dense 0.5, BM25 1.0)",
    "memory.bm25_weight": "hybrid retrieval fuses ranks with fixed weights (dense 0.5, BM25 1.0)",
    "memory.llm_neighbours": "the llm extractor shows the 5 current facts nearest each turn",
    "memory.superseded_weight": "a fixed 0.5: a superseded fact whose successor is not a candidate scores half",
    "memory.candidate_pool": "a fixed 100: each retriever ranks max(top_k, 100) candidates before fusion",
    "memory.time_weight": "a fixed 0.05: the bonus of facts dated in the year/month a question names",
    "memory.speaker_weight": "a fixed 1.0: facts said by the speaker a question is about count double",
    "rollout.tree.initial_rollouts_rule": "every tree grows rollout.tree.initial_rollouts chains (static)",
    "rollout.tree.entropy_window": "a fixed 8: entropy expansion averages the 8 tokens after a node",
    "episode.fact_order": "retrieved facts are rendered oldest first (the latest value of an attribute last)",
    "episode.memory_credit.size_weight": "the writer's reward has no memory-size penalty",
    "train.duplicates": "duplicate tree leaves are always dropped (weight 0, not in group statistics)",
}


@dataclass
class Config:
    """Root config. ``output_dir`` receives trajectories, metrics and checkpoints."""

    seed: int = 0
    output_dir: str = "runs/default"
    # Modules imported before anything is built: what they register (an extractor, a reward, a step credit...)
    # is then a name the rest of the config can use (memrl.methods.memagent, or a user's own package).
    plugins: list[str] = field(default_factory=list)
    data: DataConfig = field(default_factory=DataConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    episode: EpisodeConfig = field(default_factory=EpisodeConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


@dataclass
class Resolved:
    """A loaded config and, for each leaf key it sets (``train.lr``), the file it came from or ``override``."""

    config: Any
    sources: dict[str, str]


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
            dotted = f"{prefix}{key}"
            if dotted in RENAMED:
                new, _, note = RENAMED[dotted].partition(" ")
                raise ConfigError(
                    f"{source}: config key '{dotted}' is now '{new}'{' ' + note if note else ''}"
                )
            if dotted in REMOVED:
                raise ConfigError(f"{source}: config key '{dotted}' was removed; {REMOVED[dotted]}")
            raise ConfigError(
                f"{source}: unknown config key '{prefix}{key}'; valid keys"
                f"{' under ' + repr(where) if where else ''}: {', '.join(valid)}"
            )
        if _is_dataclass_type(hints[key]):
            _check_keys(node[key], hints[key], f"{where}.{key}" if where else str(key), source)


def leaf_keys(node: Any, cls: type, where: str = "") -> list[str]:
    """The dotted keys a layer sets, down to the fields of ``cls``'s nested dataclasses (a dict-valued field
    such as ``episode.reward_options`` is one leaf)."""
    if not isinstance(node, dict):
        return [where] if where else []
    hints = typing.get_type_hints(cls)
    keys: list[str] = []
    for key, value in node.items():
        path = f"{where}.{key}" if where else str(key)
        if _is_dataclass_type(hints.get(key)) and isinstance(value, dict):
            keys += leaf_keys(value, hints[key], path)
        else:
            keys.append(path)
    return keys


def _display(path: Path) -> str:
    """``path`` relative to the working directory when under it: the form a user typed."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _read_yaml(path: Path, included_from: str | None) -> dict:
    if not path.is_file():
        where = f" (in the defaults of {included_from})" if included_from else ""
        raise ConfigError(f"config file {str(path)!r} does not exist{where}")
    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception as exc:  # yaml errors come in many types; report them uniformly
        raise ConfigError(f"{path}: cannot parse YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping of config keys at the top level, got {type(data).__name__}"
        )
    return data


def file_layers(path: str | Path) -> list[tuple[str, dict]]:
    """The files a config is made of, in merge order (each file's ``defaults`` before it, each file once), as
    ``(displayed path, its own keys)``. A file that includes itself, directly or not, is an error."""
    layers: list[tuple[str, dict]] = []
    done: set[Path] = set()

    def visit(p: Path, stack: tuple[Path, ...], included_from: str | None) -> None:
        if p in stack:
            cycle = " -> ".join(_display(s) for s in (*stack[stack.index(p) :], p))
            raise ConfigError(f"config defaults form a cycle: {cycle}")
        if p in done:
            return
        data = _read_yaml(p, included_from)
        defaults = data.pop("defaults", [])
        if isinstance(defaults, str):
            defaults = [defaults]
        if not isinstance(defaults, list) or not all(isinstance(d, str) for d in defaults):
            raise ConfigError(
                f"{_display(p)}: 'defaults' must be a list of config file paths relative to this file, "
                f"e.g. defaults: [synthetic_chain.yaml]; got {defaults!r}"
            )
        for item in defaults:
            visit((p.parent / item).resolve(), (*stack, p), _display(p))
        done.add(p)
        layers.append((_display(p), data))

    visit(Path(path).resolve(), (), None)
    return layers


REPLACE_KEY = "replace"
_MISSING = object()


def _reset(merged: Any, keys: Any, cls: type, label: str) -> Any:
    """``replace: [data.options]`` in a file: those keys go back to their defaults before the file's own keys
    merge, so a file replaces a mapping its ``defaults`` set instead of adding to it (another adapter's options)."""
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise ConfigError(
            f"{label}: '{REPLACE_KEY}' must be a list of dotted keys, e.g. [data.options]; got {keys!r}"
        )
    fresh = OmegaConf.structured(cls)
    for key in keys:
        default = OmegaConf.select(fresh, key, default=_MISSING)
        if default is _MISSING:
            raise ConfigError(f"{label}: '{REPLACE_KEY}' names {key!r}, which is not a config key")
        OmegaConf.update(merged, key, default, merge=False)
    return merged


def resolve_config(
    path: str | Path | None = None, overrides: Sequence[str] = (), cls: type = Config
) -> Resolved:
    """Build a ``cls`` instance from dataclass defaults ← ``path``'s defaults and keys ← overrides, and record
    which layer set each key."""
    layers = file_layers(path) if path is not None else []
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. rollout.n=8")
    if overrides:
        try:
            dotlist = OmegaConf.to_container(OmegaConf.from_dotlist(list(overrides)), resolve=False)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"command-line overrides: {exc}") from exc
        layers.append((OVERRIDE_SOURCE, dotlist))
    merged = OmegaConf.structured(cls)
    sources: dict[str, str] = {}
    for source, layer in layers:
        label = "command-line overrides" if source == OVERRIDE_SOURCE else source
        replace = layer.pop(REPLACE_KEY, []) if source != OVERRIDE_SOURCE else []
        merged = _reset(merged, replace, cls, label)
        for key in [k for k in sources for r in replace if k == r or k.startswith(r + ".")]:
            del sources[key]
        _check_keys(layer, cls, "", label)
        try:
            merged = OmegaConf.merge(merged, layer)
        except OmegaConfBaseException as exc:
            raise ConfigError(f"{label}: {exc}") from exc
        for key in leaf_keys(layer, cls):
            sources[key] = source
    plugins = OmegaConf.select(merged, "plugins", default=None)
    if plugins:
        try:
            import_plugins(list(plugins))
        except RegistryError as exc:
            raise ConfigError(str(exc)) from exc
    try:
        return Resolved(OmegaConf.to_object(merged), sources)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {exc}") from exc


def load_config(path: str | Path | None = None, overrides: Sequence[str] = (), cls: type = Config) -> Any:
    """Build a ``cls`` instance: dataclass defaults ← YAML file (after its ``defaults``) ← ``key=value`` overrides.

    >>> cfg = load_config(None, ["rollout.n=8", "rollout.temperature=0.7"])
    """
    return resolve_config(path, overrides, cls).config


def to_yaml(cfg: Config) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
