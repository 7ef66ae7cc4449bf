"""``memrl bench NAME [options]``: run one benchmark and print its JSON result.

``memrl bench NAME --help`` is the bench's own help: the options after NAME go to the bench's parser, so this
parser does not claim ``-h`` for itself.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HELP_FLAGS = ("-h", "--help")


def register(sub: argparse._SubParsersAction) -> None:
    from memrl.bench import BENCH_MODULES

    p = sub.add_parser(
        "bench",
        help="run a benchmark and print JSON (memrl bench NAME --help)",
        add_help=False,
        epilog="memrl bench NAME --help lists that bench's options.",
    )
    p.add_argument("name", nargs="?", help=f"benchmark name: {', '.join(BENCH_MODULES)}")
    p.add_argument("--json", action="store_true", help="print JSON only (the default output is JSON too)")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.set_defaults(func=run, accepts_extra=True, parser=p)


def run(args: argparse.Namespace) -> int:
    from memrl.bench import BENCHES
    from memrl.registry import RegistryError

    if args.name is None or args.name in HELP_FLAGS:
        args.parser.print_help()
        return 0 if args.name in HELP_FLAGS or set(args.extra) & set(HELP_FLAGS) else 2
    try:
        bench = BENCHES.get(args.name)
    except RegistryError as exc:
        args.parser.error(str(exc.args[0]))
    result = bench(list(args.extra))  # with --help, the bench's own parser prints its options and exits
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    sys.stdout.flush()
    return 0
