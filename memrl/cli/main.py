"""``memrl`` command line: one module per subcommand under ``memrl.cli``.

Each module exposes ``register(subparsers)`` which adds its parser and sets ``func(args) -> int``.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# Order = order in --help.
COMMANDS = (
    "run",
    "train",
    "report",
    "eval",
    "config",
    "data",
    "bench",
    "inspect",
    "serve",
    "sandbox",
    "doctor",
)
# Commands that run a model: they set torch's thread count from the machine's load first (memrl.threads).
MODEL_COMMANDS = frozenset({"run", "train", "eval", "bench", "serve", "doctor"})
# Long commands: they choose the thread count again between phases as other jobs start and end (memrl.threads).
FOLLOW_COMMANDS = frozenset({"run", "train", "eval"})
# Libraries whose INFO lines read like failures or noise on every run: faiss reports each CPU-specific build it
# could not load ("Could not load library with AVX512 support due to: ModuleNotFoundError"), httpx every request.
# They log at WARNING and above unless -v.
QUIET_LOGGERS = (
    "faiss",
    "httpx",
    "httpcore",
    "urllib3",
    "sentence_transformers",
    "numexpr",
    "filelock",
    "datasets",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="memrl", description="Train LLM agents that remember.")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"memrl.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"memrl.cli.{name}":  # command not built in this checkout
                continue
            raise
        module.register(sub)
    return parser


def configure_logging(verbose: bool) -> None:
    """memrl's own INFO lines on stderr (DEBUG with ``-v``); third-party INFO only with ``-v``."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    # Commands that forward options (bench NAME ..., run/train key=value overrides) set accepts_extra.
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra = extra
    configure_logging(args.verbose)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    if args.command in MODEL_COMMANDS:
        from memrl.threads import apply_threads, stop_following

        try:
            apply_threads(follow=args.command in FOLLOW_COMMANDS)
        except ValueError as exc:  # a malformed MEMRL_THREADS
            parser.error(str(exc))
        try:
            return _run_command(args)
        finally:
            stop_following()
    return _run_command(args)


def _run_command(args: argparse.Namespace) -> int:
    from memrl.data.adapters import AdapterError
    from memrl.disk import DiskFullError, is_disk_full
    from memrl.policy.errors import PolicyError

    try:
        return int(args.func(args) or 0)
    except (AdapterError, PolicyError, DiskFullError) as exc:
        # Bad input, a missing model or a full disk: the message names the file / setting and the fix; a
        # traceback would only hide it (-v keeps the traceback for debugging).
        if args.verbose:
            raise
        print(f"memrl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A full disk at a write without its own DiskFullError (a metrics line, an output file): still one line.
        if args.verbose or not is_disk_full(exc):
            raise
        where = f" writing {exc.filename}" if exc.filename else ""
        print(
            f"memrl {args.command}: error: no space left on the disk{where} ({exc}); free space, or move "
            "MEMRL_CACHE_DIR / output_dir to a larger filesystem (-v shows where it happened)",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
