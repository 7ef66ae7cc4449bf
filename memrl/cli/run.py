"""``memrl run --config FILE [key=value ...]``: episodes → Parquet trajectories + metrics.json (resumable)."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run episodes and write trajectories (Parquet) + metrics.json")
    p.add_argument("--config", help="YAML config (see configs/)")
    p.add_argument("--output-dir", help="overrides output_dir")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    p.add_argument(
        "--fresh", action="store_true", help="discard earlier results in the output dir (no resume)"
    )
    p.set_defaults(func=run, accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    from memrl.config import load_config
    from memrl.episode.pipeline import run_episodes

    cfg = load_config(args.config, args.extra)
    if args.fresh:
        from memrl.episode.output import clear_results

        clear_results(args.output_dir or cfg.output_dir)
    metrics = run_episodes(cfg, args.output_dir, progress=not args.no_progress)
    print(json.dumps({k: v for k, v in metrics.items() if k.startswith("run/")}, indent=2, sort_keys=True))
    return 0
