"""``memrl run --config FILE [key=value ...]``: episodes → Parquet trajectories + metrics.json (resumable)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_job_options(p: argparse.ArgumentParser, func) -> None:
    """Options shared by the episode jobs (``run``, ``eval``): config, output dir, progress, fresh start."""
    p.add_argument("--config", help="YAML config (see configs/)")
    p.add_argument("--output-dir", help="overrides output_dir")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    p.add_argument(
        "--fresh", action="store_true", help="discard earlier results in the output dir (no resume)"
    )
    p.set_defaults(func=func, accepts_extra=True)


def load_job_config(args: argparse.Namespace) -> Any:
    """The config of an episode job; with ``--fresh`` the output dir's earlier results are discarded first."""
    from memrl.config import load_config

    cfg = load_config(args.config, args.extra)
    if args.fresh:
        from memrl.episode.evaluate import clear_results

        clear_results(args.output_dir or cfg.output_dir)
    return cfg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run episodes and write trajectories (Parquet) + metrics.json")
    add_job_options(p, run)


def run(args: argparse.Namespace) -> int:
    from memrl.episode.pipeline import run_episodes

    cfg = load_job_config(args)
    metrics = run_episodes(cfg, args.output_dir, progress=not args.no_progress)
    print(json.dumps({k: v for k, v in metrics.items() if k.startswith("run/")}, indent=2, sort_keys=True))
    return 0
