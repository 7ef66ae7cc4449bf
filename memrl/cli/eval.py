"""``memrl eval --config FILE [key=value ...]``: scores per category, with vs without memory, token costs."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="benchmark scores with and without memory (writes eval.json)")
    p.add_argument("--config", help="YAML config (see configs/)")
    p.add_argument("--output-dir", help="overrides output_dir")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    p.add_argument(
        "--fresh", action="store_true", help="discard earlier results in the output dir (no resume)"
    )
    p.set_defaults(func=run, accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    from memrl.config import load_config
    from memrl.episode.evaluate import evaluate

    cfg = load_config(args.config, args.extra)
    if args.fresh:
        from memrl.episode.output import clear_results

        clear_results(args.output_dir or cfg.output_dir)
    report = evaluate(cfg, args.output_dir, progress=not args.no_progress)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0
