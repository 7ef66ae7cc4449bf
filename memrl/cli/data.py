"""``memrl data``: validate a dataset through its adapter, or print one episode.

    memrl data fetch locomo                      # official locomo10.json into $MEMRL_CACHE_DIR/datasets/
    memrl data check locomo locomo10.json --json
    memrl data check synthetic - --option num_episodes=200 --split test
    memrl data show synthetic --index 3
    memrl data haystack --oracle longmemeval_oracle.json --sessions 50 --out longmemeval_s_like.json
    memrl data make-chats chats.json --chats 24            # held-out chats (memrl.adapters.chats), LoCoMo format
    memrl data make-chats train.json --split train         # chats of the training pool (no shared word)
    memrl data make-chats novel.json --kinds novel         # held-out chats of kinds training never states

``fetch`` downloads a dataset's official files (:mod:`memrl.data.sources`: checksummed, resumable) and prints
``[{"name", "path", "sha256", "bytes", "status", "checksum"}]``. ``check`` prints ``{"episodes": N, "skipped": M, "errors": [...]}``; each error names file, record, field and
what was expected. ``haystack`` builds LongMemEval ``_S``-like haystacks from the oracle file
(:mod:`memrl.data.haystack`) and prints ``{"out", "questions", "sessions_min", "sessions_max", "bytes"}``.
``make-chats`` writes the held-out free-form chats (:mod:`memrl.adapters.chats`; evaluation only), or with
``--split train`` / ``validation`` chats of its disjoint training pool, and prints
``{"out", "chats", "questions", "turns"}``; the ``chats`` adapter reads the file, or generates the same chats
without one. Exit code: 0 ok, 1 the dataset is invalid (strict mode) or unreadable, 2 bad usage
(unknown adapter, unknown option).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from memrl.adapters.chats import KINDS
from memrl.data.sources import SOURCES
from memrl.registry import RegistryError

EXIT_INVALID = 1
EXIT_USAGE = 2


def parse_options(items: list[str]) -> dict[str, Any]:
    """``["num_episodes=10", "question_types=[\\"lookup\\"]"]`` → dict; values are JSON where they parse."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--option {item!r}: expected key=value, e.g. --option num_episodes=100")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # plain strings need no quotes
    return out


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("adapter", help="adapter name (synthetic, locomo, longmemeval) or package.module:function")
    p.add_argument(
        "path",
        nargs="?",
        default=None,
        help="dataset file: as given, else in $MEMRL_DATA_DIR, else fetched by `memrl data fetch` (default: "
        "the dataset's default file; '-' or omitted for synthetic)",
    )
    p.add_argument(
        "--split",
        default="all",
        help="train | validation (locomo --option split_scheme=memory_r1) | test | all (default: all)",
    )
    p.add_argument(
        "--lenient", action="store_true", help="skip bad records and report them instead of failing"
    )
    p.add_argument(
        "--option", action="append", default=[], metavar="KEY=VALUE", help="adapter option (repeatable)"
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("data", help="fetch a dataset, check it through its adapter, or show one episode")
    data_sub = p.add_subparsers(dest="data_command", metavar="ACTION")
    _register_fetch(data_sub)
    check = data_sub.add_parser("check", help='print {"episodes", "skipped", "errors"} for a dataset')
    _common(check)
    check.add_argument("--json", action="store_true", help="print only the JSON summary")
    check.set_defaults(func=run_check)
    show = data_sub.add_parser("show", help="print one episode of a dataset")
    _common(show)
    show.add_argument("--index", type=int, default=0, help="episode index (default 0)")
    show.set_defaults(func=run_show)
    hay = data_sub.add_parser(
        "haystack", help="build LongMemEval _S-like haystacks (evidence among other questions' sessions)"
    )
    hay.add_argument("--oracle", required=True, help="longmemeval_oracle.json (evidence sessions only)")
    hay.add_argument("--out", required=True, help="output file, official _s format")
    hay.add_argument("--sessions", type=int, default=50, help="sessions per haystack (default 50)")
    hay.add_argument(
        "--filler-days",
        type=int,
        default=30,
        help="filler dates start this long before the first evidence session (default 30)",
    )
    hay.add_argument("--seed", type=int, default=0, help="random seed of the filler draws (default 0)")
    hay.add_argument(
        "--questions", type=int, default=None, help="N questions spread evenly over the file (default: all)"
    )
    hay.set_defaults(func=run_haystack)
    chats = data_sub.add_parser(
        "make-chats", help="write the held-out free-form chats (LoCoMo format; for evaluation only)"
    )
    chats.add_argument("--split", default="test", choices=("test", "train", "validation"),
                       help="test: the held-out chats (default); train / validation: the training pool's")  # fmt: skip
    chats.add_argument("out", help="output file (JSON array, LoCoMo's format)")
    chats.add_argument("--chats", type=int, default=24, help="number of chats (default 24)")
    chats.add_argument("--seed", type=int, default=0, help="generator seed (default 0)")
    chats.add_argument("--kinds", default="seen", choices=KINDS,
                       help="seen: the training chats' attribute kinds (default); novel: held-out chats of kinds no "
                       "training chat states")  # fmt: skip
    chats.set_defaults(func=run_make_chats)
    p.set_defaults(func=lambda args: (p.print_help(), EXIT_USAGE)[1])


def _register_fetch(data_sub: argparse._SubParsersAction) -> None:
    files = "; ".join(
        f"{src.name}: " + ", ".join(f"{f.name} ({f.size_hint})" for f in src.files)
        for src in SOURCES.values()
    )
    fetch = data_sub.add_parser(
        "fetch",
        help="download a dataset's official files into the cache (checksummed, resumable)",
        description=(
            "Download the official files into $MEMRL_CACHE_DIR/datasets/DATASET (default ~/.cache/memrl), where "
            "configs find them. An interrupted download resumes from its .part file. SHA-256 checksums are "
            "pinned for locomo10.json and longmemeval_oracle.json; longmemeval_s/_m have none published here, "
            "so their checksum is recorded on the first download (checksums.json) and later fetches are held "
            f"to it. Files: {files}."
        ),
    )
    fetch.add_argument("dataset", choices=sorted(SOURCES), help="dataset to download")
    fetch.add_argument(
        "--file", action="append", default=[], help="file to fetch (repeatable; default: the first listed)"
    )
    fetch.add_argument("--all", action="store_true", help="fetch every official file of the dataset")
    fetch.add_argument("--dir", default=None, help="target folder (default: the cache)")
    fetch.add_argument("--force", action="store_true", help="download again even if the file is present")
    fetch.set_defaults(func=run_fetch)


def run_fetch(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memrl.data.sources import FetchError, fetch

    files = [f.name for f in SOURCES[args.dataset].files] if args.all else args.file
    folder = Path(args.dir).expanduser() if args.dir else None
    try:
        fetched = fetch(args.dataset, files, folder=folder, force=args.force)
    except ValueError as exc:
        print(f"memrl data fetch: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except FetchError as exc:
        print(f"memrl data fetch: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print(json.dumps([f.to_dict() for f in fetched], indent=2))
    return 0


def _load(args: argparse.Namespace):
    from memrl.data.adapters import run_adapter

    path = None if args.path in (None, "-") else args.path
    return run_adapter(
        args.adapter, path, split=args.split, lenient=args.lenient, options=parse_options(args.option)
    )


def run_check(args: argparse.Namespace) -> int:
    from memrl.data.adapters import AdapterError

    try:
        episodes, report = _load(args)
    except AdapterError as exc:
        summary = {"episodes": 0, "skipped": 0, "errors": [exc.to_dict()]}
        _print_summary(summary, args.json)
        return EXIT_INVALID
    except (RegistryError, ValueError) as exc:
        print(f"memrl data check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    summary = {"episodes": len(episodes), "skipped": report.skipped, "errors": report.to_dicts()}
    _print_summary(summary, args.json)
    return 0


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(summary, indent=2))
        return
    print(f"episodes: {summary['episodes']}  skipped: {summary['skipped']}")
    for err in summary["errors"]:
        print(f"  - {err['message']}")


def run_show(args: argparse.Namespace) -> int:
    from memrl.data.adapters import AdapterError

    try:
        episodes, _ = _load(args)
    except (AdapterError, RegistryError, ValueError) as exc:
        print(f"memrl data show: {exc}", file=sys.stderr)
        return EXIT_INVALID if isinstance(exc, AdapterError) else EXIT_USAGE
    if not 0 <= args.index < len(episodes):
        print(f"memrl data show: --index {args.index} out of range (0..{len(episodes) - 1})", file=sys.stderr)
        return EXIT_USAGE
    ep = episodes[args.index]
    print(f"episode {ep.episode_id}  group {ep.group_id}")
    for turn in ep.turns:
        stamp = f"[{turn.timestamp}] " if turn.timestamp else ""
        print(f"{turn.role.value:>7} {turn.turn_id:>10} {stamp}{turn.speaker}: {turn.text}")
    print(f"answer: {ep.target_answer!r}")
    print(f"metadata: {json.dumps(dict(ep.metadata), default=str)}")
    return 0


def run_haystack(args: argparse.Namespace) -> int:
    from memrl.data.adapters import AdapterError
    from memrl.data.haystack import HaystackSpec, write_haystacks

    try:
        spec = HaystackSpec(args.sessions, args.seed, args.filler_days, args.questions)
    except ValueError as exc:
        print(f"memrl data haystack: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        summary = write_haystacks(args.oracle, args.out, spec)
    except AdapterError as exc:
        print(f"memrl data haystack: {exc}", file=sys.stderr)
        return EXIT_INVALID
    print(json.dumps(summary, indent=2))
    return 0


def run_make_chats(args: argparse.Namespace) -> int:
    from pathlib import Path

    from memrl.adapters.chats import make_chats

    try:
        records = make_chats(args.chats, args.seed, split=args.split, kinds=args.kinds)
    except ValueError as exc:
        print(f"memrl data make-chats: {exc}", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out)
    out.write_text(json.dumps(records, indent=1) + "\n", encoding="utf-8")
    turns = sum(len(v) for r in records for k, v in r["conversation"].items() if isinstance(v, list))
    print(json.dumps({"out": str(out), "chats": len(records), "questions": sum(len(r["qa"]) for r in records),
                      "turns": turns}))  # fmt: skip
    return 0
