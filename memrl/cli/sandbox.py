"""``memrl sandbox run FILE.py [--json]``: run one file exactly the way the python tool does."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sandbox", help="run code in the tool sandbox (debug tool code)")
    actions = p.add_subparsers(dest="sandbox_action", metavar="ACTION")
    run_p = actions.add_parser("run", help="run FILE.py in the sandbox and print what the tool would see")
    run_p.add_argument("file", help="python file to run ('-' reads stdin)")
    run_p.add_argument(
        "--json", action="store_true", help="print {exit_code, stdout, stderr, timed_out, killed_reason}"
    )
    run_p.add_argument("--config", help="YAML config; its tools.sandbox section is used")
    run_p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. tools.sandbox.timeout_s=2")
    run_p.set_defaults(func=run, accepts_extra=True)  # overrides may follow options
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def run(args: argparse.Namespace) -> int:
    from memrl.config import load_config
    from memrl.tools.sandbox import Sandbox

    if args.file == "-":
        code = sys.stdin.read()
    else:
        path = Path(args.file)
        if not path.is_file():
            print(f"memrl sandbox run: {args.file!r} is not a file", file=sys.stderr)
            return 2
        code = path.read_text(encoding="utf-8")
    overrides = [*args.overrides, *getattr(args, "extra", [])]
    cfg = load_config(args.config, overrides).tools.sandbox
    with Sandbox(cfg) as sb:
        result = sb.run(code)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        sys.stdout.write(result.stdout)
        sys.stdout.flush()
        sys.stderr.write(result.stderr)
        if result.killed_reason:
            print(f"[sandbox] killed: {result.killed_reason}", file=sys.stderr)
    return 0 if result.exit_code == 0 else 1
