"""``memrl inspect RUN_DIR [--episode ID] [--html OUT.html]``: look at episodes of a ``memrl run`` output.

Without ``--episode``: one line per episode (category, leaves, mean reward, gold-evidence hit, tool calls, failed
calls, rollbacks, calls that printed the gold answer, answers that copied a result), then the run's tool use.
With it: the episode's history turns and their memory ops, the final facts and summary, the retrieved facts with
scores and gold-evidence hits, the generation tree, every leaf (tool output highlighted), rollbacks, rewards.
``--html`` also writes a self-contained page with the tree drawn as SVG. Exit code 2 on a bad run dir or id.
"""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="show one episode of a run (terminal view, --html page)")
    p.add_argument("run_dir", help="output_dir of `memrl run`")
    p.add_argument(
        "--episode", help="episode id (a source id, or a leaf id like ID#2); default: list episodes"
    )
    p.add_argument("--html", metavar="OUT.html", help="also write a self-contained HTML page of the episode")
    p.add_argument("--width", type=int, default=None, help="terminal width (default: detect)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from memrl.inspect import InspectError, load_run, write_html
    from memrl.inspect.summary import episode_row, run_tool_use
    from memrl.inspect.terminal import render, render_run_table

    console = Console(width=args.width)
    try:
        run_ = load_run(args.run_dir)
        if not args.episode:
            if args.html:
                print("memrl inspect: --html needs --episode ID", file=sys.stderr)
                return 2
            views = run_.episode_views()
            render_run_table([episode_row(v) for v in views], console, run_tool_use(views))
            return 0
        view = run_.episode(args.episode)
    except InspectError as exc:
        print(f"memrl inspect: {exc}", file=sys.stderr)
        return 2
    render(view, console)
    if args.html:
        out = write_html(view, args.html)
        console.print(f"wrote {out}")
    return 0
