"""``memrl train --config configs/synthetic_tree.yaml [key=value ...]``: LoRA GRPO training.

Resumes automatically from the newest complete checkpoint in ``<output_dir>/checkpoints`` (``--fresh`` refuses
to start over an existing run instead of silently mixing two). Ends with a table of the held-out scores before and
after training (:mod:`memrl.train.summary_table`), the run dir and the next commands; ``--json`` prints the run's
``summary.json`` instead.
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
    p.add_argument("--json", action="store_true", help="end with summary.json instead of the table")
    p.set_defaults(func=run, accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    from memrl.config import ConfigError, load_config
    from memrl.train.checkpoint import latest_checkpoint
    from memrl.train.loop import train
    from memrl.train.summary_table import format_summary

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
    print(json.dumps(summary, indent=2, sort_keys=True) if args.json else format_summary(summary))
    return 0
