from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run a benchmark and print JSON (memrl bench NAME --help)")
    p.add_argument("name", help="benchmark name: batch, memory, policy, sandbox, rollout, episodes, extract")
    p.add_argument("--json", action="store_true", help="print JSON only (the default output is JSON too)")
    p.add_argument("--out", help="also write the JSON result to this file")
    p.set_defaults(func=run, accepts_extra=True)


def run(args: argparse.Namespace) -> int:
    from memrl.bench import BENCHES

    result = BENCHES.get(args.name)(list(args.extra))
    text = json.dumps(result, indent=2, sort_keys=True)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    sys.stdout.flush()
    return 0
