"""Each bench's defaults are the run docs/benchmarks.md reports: ``memrl bench NAME --json`` reproduces it."""

from __future__ import annotations

import importlib
import re
import shlex
from pathlib import Path

import pytest

from memrl.bench import BENCH_MODULES

DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"

# The settings each documented measurement states in its text (docs/benchmarks.md).
DOCUMENTED = {
    "batch": {"groups": 4, "group_size": 8, "prompt_min": 300, "prompt_max": 600, "response_max": 96,
              "layers": 2, "threads": 1, "repeats": 2},
    "policy": {"model": "random", "prefix_tokens": 1024, "branches": 8, "branch_tokens": 16},
    "lora": {"model": "smollm2-135m", "batch": 4, "prompt_tokens": 400, "gen_tokens": 72, "rank": 16},
    "sandbox": {"runs": 1000, "timeout_fraction": 0.1},
    "rollout": {"model": "random", "prompts": 32, "leaves": 16, "max_tokens": 192, "seeds": 4, "repeats": 3,
                "initial_rollouts": 1, "expansion_iterations": 3},
    "episodes": {"model": "smollm2-135m", "episodes": 16, "n": 2, "max_tokens": 48, "tools": "python"},
    "memory": {"dataset": "locomo", "categories": "1,2,3,4"},
    "extract": {"episodes": 4, "extractor": "both", "overrides": {"llm_max_tokens": 64}},
    "engines": {"model": "smollm2-135m", "engines": "hf,vllm", "write_neighbours": 4, "write_max_tokens": 8,
                "episodes": 16, "leaves": 8, "answer_max_tokens": 96},
    "parity": {"config": "configs/synthetic_memory_eval.yaml", "episodes": 16, "overrides": []},
    "attention": {"model": "smollm2-135m", "dtype": "bfloat16", "prefix_tokens": 142, "tails": "480,1227",
                  "decode": "8x620,32x1350", "new_tokens": 24, "repeats": 3},
}  # fmt: skip


def _defaults(name: str) -> dict:
    return vars(importlib.import_module(f"memrl.bench.{name}").parse_args([]))


@pytest.mark.parametrize("name", BENCH_MODULES)
def test_defaults_are_the_documented_run(name):
    defaults = _defaults(name)
    assert {k: defaults[k] for k in DOCUMENTED[name]} == DOCUMENTED[name]


def _summary_commands() -> dict[str, list[str]]:
    """The first command of each bench in the summary table, without ``--json`` and the data file."""
    first: dict[str, list[str]] = {}
    for name, rest in re.findall(r"^\| `memrl bench (\w+)([^`]*)` \|", DOCS.read_text(), flags=re.M):
        argv = shlex.split(rest.replace("<", "'<").replace(">", ">'"))
        argv = [a for a in argv if a != "--json"]
        if "--path" in argv:  # the user's dataset file, never a default
            i = argv.index("--path")
            del argv[i : i + 2]
        first.setdefault(name, argv)
    return first


def test_the_summary_table_s_commands_are_the_defaults():
    commands = _summary_commands()
    assert set(commands) == set(BENCH_MODULES)
    for name, argv in commands.items():
        module = importlib.import_module(f"memrl.bench.{name}")
        assert vars(module.parse_args(argv)) == _defaults(name), (name, argv)
