"""``memrl eval --config FILE [key=value ...]``: scores per category, with vs without memory, token costs.

Prints a short table (per arm, then per question type / category) and the path of ``eval.json``, which holds
the whole report; ``--json`` prints that report on stdout instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memrl.cli.run import add_job_options, load_job_config


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="benchmark scores with and without memory (writes eval.json)")
    add_job_options(p, run)
    p.add_argument("--json", action="store_true", help="print the whole report as JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    from memrl.episode.evaluate import evaluate_ablations
    from memrl.episode.report_table import render_eval

    cfg = load_job_config(args)
    out_dir = Path(args.output_dir or cfg.output_dir)
    report = evaluate_ablations(cfg, out_dir, progress=not args.no_progress)
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(render_eval(report))
        print(f"\nfull report: {out_dir / 'eval.json'}")
    return 0
