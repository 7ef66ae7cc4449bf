"""``memrl train --config configs/synthetic_tree.yaml [key=value ...]``: LoRA GRPO training.

Resumes automatically from the newest complete checkpoint in ``<output_dir>/checkpoints`` (``--fresh`` refuses
to start over an existing run instead of silently mixing two). Prints ``summary.json`` at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="LoRA GRPO training with checkpoints and resume")
    p.add_argument("--config", help="YAML config (see configs/synthetic_*.yaml)")
    p.add_argument("--name", help="run name: output_dir becomes runs/<name>")
    p.add_argument("--fresh", action="store_true", help="fail if output_dir already holds checkpoints")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars (evaluations, steps)")
    p.set_defaults(func=run, accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    from memrl.config import ConfigError, load_config
    from memrl.train.checkpoint import latest_checkpoint
    from memrl.train.loop import train

    overrides = list(args.extra)
    if args.name:
        overrides.append(f"output_dir=runs/{args.name}")
    try:
        cfg = load_config(args.config, overrides)
    except (ConfigError, ValueError) as exc:
        print(f"memrl train: {exc}", file=sys.stderr)
        return 2
    if args.fresh and latest_checkpoint(Path(cfg.output_dir) / "checkpoints") is not None:
        print(
            f"memrl train: {cfg.output_dir} already has checkpoints (drop --fresh to resume)", file=sys.stderr
        )
        return 2
    summary = train(cfg, progress=not args.no_progress)
    print(json.dumps(summary, indent=2, sort_keys=True))
    return 0
