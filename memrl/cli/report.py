"""``memrl report --arm NAME RUN_DIR... [--arm NAME RUN_DIR...] [--subset NAME] [--plot FILE.png]``: training runs
over seeds."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="compare `memrl train` runs over seeds by their evaluation reward (exact match, or LoCoMo F1): the "
        "mean with a seed bootstrap interval, tokens to reach the reference's score (the first --arm is the "
        "reference)",
    )
    p.add_argument(
        "--arm",
        nargs="+",
        action="append",
        required=True,
        metavar=("NAME", "RUN_DIR"),
        help="an arm's name, then its run directories (one per seed); repeat for each arm",
    )
    p.add_argument(
        "--subset",
        metavar="NAME",
        help="report one part of the evaluations, eval/em/NAME (LoCoMo's categories 1-4: answerable)",
    )
    p.add_argument("--plot", metavar="FILE.png", help="also draw in-run EM vs generated tokens for every run")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memrl.train.report import ReportError, compare, load_run, plot_report

    arms = {}
    for spec in args.arm:
        if len(spec) < 2:
            raise SystemExit(f"memrl report: --arm {spec[0]} names no run directory (--arm NAME RUN_DIR...)")
        name, dirs = spec[0], spec[1:]
        if name in arms:
            raise SystemExit(f"memrl report: arm {name!r} given twice")
        try:
            arms[name] = [load_run(d, args.subset) for d in dirs]
        except ReportError as exc:
            raise SystemExit(f"memrl report: {exc}") from exc
    report = compare(arms)
    if args.plot:
        report["plot"] = str(plot_report(arms, args.plot))
    print(json.dumps(report, indent=2))
    return 0
