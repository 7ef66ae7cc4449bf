"""``memrl model tiny``: build (or find) the embedded tiny policy and print where it is and how good it is."""

from __future__ import annotations

import argparse
import json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="build the embedded tiny model (memrl model tiny)")
    p.add_argument("which", choices=["tiny"], help="which model to build")
    p.add_argument("--force", action="store_true", help="rebuild even if the cache has it")
    p.add_argument(
        "--steps", type=int, default=None, help="SFT steps (changes the recipe, hence the cache dir)"
    )
    p.add_argument("--json", action="store_true", help="print the metrics as JSON (default: a short summary)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from memrl.policy.tiny import TinyRecipe, ensure_tiny_model

    recipe = TinyRecipe()
    if args.steps is not None:
        recipe = dataclasses.replace(recipe, steps=args.steps)
    path = ensure_tiny_model(recipe, force=args.force)
    metrics = json.loads((path / "metrics.json").read_text())
    summary = {
        "path": str(path),
        "num_parameters": metrics["num_parameters"],
        "build_time_s": round(metrics["time_s"]["total"], 1),
        "em_with_gold_facts": metrics["eval/em_with_gold_facts"],
        "em_without_gold_facts": metrics["eval/em_without_gold_facts"],
        "em_with_gold_facts_by_type": metrics["eval/em_with_gold_facts_by_type"],
    }
    if args.json:
        print(json.dumps({k: v for k, v in metrics.items() if k != "losses"} | {"path": str(path)}, indent=2))
    else:
        print(json.dumps(summary, indent=2))
    return 0
