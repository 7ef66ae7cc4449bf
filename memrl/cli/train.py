"""``memrl train --config configs/synthetic_tree.yaml [key=value ...]``: LoRA GRPO training.

Resumes from the newest complete checkpoint in ``<output_dir>/checkpoints``; ``--fresh`` discards what an earlier
run wrote there first, as in ``memrl run`` / ``memrl eval``. Ends with a table of the held-out scores before and
after training (:mod:`memrl.train.summary_table`), the run dir and the next commands; ``--json`` prints the run's
``summary.json`` instead.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

# What `memrl train` writes under output_dir (memrl.train.loop, memrl.train.metrics, memrl.train.setup);
# --fresh removes these and nothing else, so a directory shared with other files keeps them (names kept here so
# the CLI starts without importing torch; tests/cli/test_train.py checks them against memrl.train.loop).
TRAIN_OUTPUTS = (
    "checkpoints",
    "warm_start",
    "live_adapter",
    "tb",
    "metrics.jsonl",
    "summary.json",
    "curve.png",
    "eval_final",
)


def clear_training(out_dir: str | Path) -> list[str]:
    """Remove an earlier training run's outputs from ``out_dir``; returns the names removed."""
    removed = []
    for name in TRAIN_OUTPUTS:
        path = Path(out_dir) / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
        else:
            continue
        removed.append(name)
    return removed


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="LoRA GRPO training with checkpoints and resume")
    p.add_argument("--config", help="YAML config (see configs/)")
    p.add_argument("--name", help="run name: output_dir becomes runs/<name>")
    p.add_argument(
        "--fresh", action="store_true", help="discard an earlier run in the output dir (no resume)"
    )
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars (evaluations, steps)")
    p.add_argument("--json", action="store_true", help="end with summary.json instead of the table")
    p.set_defaults(func=run, accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    from memrl.config import ConfigError, load_config
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
    if args.fresh and (removed := clear_training(cfg.output_dir)):
        print(f"memrl train: --fresh: removed {', '.join(removed)} from {cfg.output_dir}", file=sys.stderr)
    summary = train(cfg, progress=not args.no_progress)
    print(json.dumps(summary, indent=2, sort_keys=True) if args.json else format_summary(summary))
    return 0
