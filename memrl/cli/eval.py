"""``memrl eval --config FILE [key=value ...]``: scores per category, with vs without memory, token costs."""

from __future__ import annotations

import argparse
import json

from memrl.cli.run import add_job_options, load_job_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="benchmark scores with and without memory (writes eval.json)")
    add_job_options(p, run)


def run(args: argparse.Namespace) -> int:
    from memrl.episode.evaluate import evaluate

    cfg = load_job_config(args)
    report = evaluate(cfg, args.output_dir, progress=not args.no_progress)
    print(json.dumps(report, indent=2, sort_keys=True))
    return 0
