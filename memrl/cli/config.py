"""``memrl config show CONFIG [key=value ...] [--all]``: the resolved config, each key with the file it came from.

A key set by no file and no override is the dataclass default; ``--all`` lists those too, with a line of help
for the stable knobs and ``[experiment]`` on the knobs kept for experiments (``memrl.config_knobs``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

import yaml

COMMENT_COLUMN = 44


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("config", help="show the resolved config of a run, with each key's source")
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show = actions.add_parser("show", help="print CONFIG with its defaults and overrides applied")
    show.add_argument("config", help="YAML config (see configs/)")
    show.add_argument(
        "--all", action="store_true", help="also the keys no file sets (their defaults), with help"
    )
    show.set_defaults(func=run, accepts_extra=True)


def _value(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def render(cfg: Any, sources: dict[str, str], show_all: bool = False) -> str:
    """``cfg`` as YAML, each leaf followed by ``# source``; without ``show_all`` only the keys a layer sets."""
    from memrl.config import DEFAULT_SOURCE
    from memrl.config_knobs import describe

    lines: list[str] = []

    def walk(obj: Any, where: str, indent: str) -> None:
        for f in dataclasses.fields(obj):
            key = f"{where}.{f.name}" if where else f.name
            value = getattr(obj, f.name)
            if dataclasses.is_dataclass(value):
                start = len(lines)
                walk(value, key, indent + "  ")
                if len(lines) > start:
                    lines.insert(start, f"{indent}{f.name}:")
                continue
            if key not in sources and not show_all:
                continue
            text = f"{indent}{f.name}: {_value(value)}"
            note = sources.get(key, DEFAULT_SOURCE)
            if show_all:
                tier, help_text = describe(key)
                if tier == "experiment":
                    note += "  [experiment]"
                if help_text:
                    note += f"  {help_text}"
            lines.append(f"{text.ljust(COMMENT_COLUMN - 1)} # {note}")

    walk(cfg, "", "")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from memrl.config import ConfigError, resolve_config

    try:
        resolved = resolve_config(args.config, args.extra)
    except (ConfigError, ValueError) as exc:
        print(f"memrl config: {exc}", file=sys.stderr)
        return 2
    print(render(resolved.config, resolved.sources, show_all=args.all))
    return 0
