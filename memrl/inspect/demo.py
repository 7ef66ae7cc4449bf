"""A small real run to inspect when you have none: ``memrl run``'s pipeline with a scripted policy.

Everything but the model is real: the synthetic dataset, MiniLM + FAISS memory with summaries, the tree rollout
with the sandboxed ``python`` tool and tool rollback, the reward registry and the Parquet writer. The "model" is
a :class:`~memrl.testing.scripted.ScriptedPolicy` that behaves like a small tool-using agent, so the run has tool
calls, failed calls that get rolled back, branch points with varying entropy and leaves with different rewards
(a random-init tiny Llama would only write bytes noise). Notebooks and tests use it; for a real model run
``memrl run --config ...`` and point the inspector at its ``output_dir``.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import Any

from memrl.testing.scripted import ScriptContext, ScriptedTurn

_NUMBER = re.compile(r"\b\d{1,4}\b")
_FACT_LINE = re.compile(r"^- \[[^\]]*\]\s*(.+?)(?: \([^)]*\))?$", re.M)


def _tops(rng: random.Random, n: int, sharp: bool) -> tuple[tuple[float, ...], tuple[dict[int, float], ...]]:
    """Per-token logprobs and top-5 distributions; ``sharp`` = a confident stretch (low entropy)."""
    lps, tops = [], []
    for _ in range(n):
        weights = [rng.random() ** (6 if sharp else 1) for _ in range(5)]
        total = sum(weights)
        probs = sorted((w / total for w in weights), reverse=True)
        lps.append(math.log(max(probs[0], 1e-9)))
        tops.append({1000 + j: math.log(max(p, 1e-9)) for j, p in enumerate(probs)})
    return tuple(lps), tuple(tops)


def demo_script(ctx: ScriptContext) -> ScriptedTurn:
    """The scripted agent: compute with python over remembered numbers (sometimes with a bug), then answer.

    Branches differ through the sampling seed: one uses a number from memory, another a remembered word, a
    third writes ``print(age + 7)`` (a NameError the rollback machinery repairs).
    """
    prompt, _, response = ctx.text.rpartition("<|assistant|>\n")
    rng = random.Random(hash((ctx.seed, ctx.sample_index, len(ctx.prompt_ids))) & 0xFFFFFFFF)
    facts = _FACT_LINE.findall(prompt)
    numbers = [int(x) for x in _NUMBER.findall("\n".join(facts))] or [7]
    results = re.findall(r"<result>\s*(.*?)\s*</result>", response, re.S)
    failed = bool(results) and ("Error" in results[-1] or "failed with" in response[-200:])
    if results and results[-1].strip() and not failed:
        guess = results[-1].strip().split()[-1]
        if rng.random() < 0.4 and facts:
            guess = facts[-1].rstrip(".").split()[-1]
        text = f"<answer>{guess}</answer>"
    elif failed or "failed with" in response or rng.random() < 0.6:
        a, b = rng.choice(numbers), rng.choice(numbers)
        text = f"<python>print({a} + {b})</python>"
    else:
        text = "<python>print(age + 7)</python>"
    lps, tops = _tops(rng, len(text.encode()) + 1, sharp=rng.random() < 0.5)
    return ScriptedTurn(text=text, logprobs=lps, top_logprobs=tops)


def demo_overrides(out_dir: str | Path, num_episodes: int) -> list[str]:
    """Config overrides of the demo run (``key=value`` as on the command line)."""
    return [
        f"output_dir={out_dir}",
        "data.adapter=synthetic",
        "data.split=train",
        f"data.options={{num_episodes: {num_episodes}, seed: 3}}",
        "tools.enabled=[python]",
        "rollout.strategy=tree",
        "rollout.n=4",
        "rollout.max_response_tokens=160",
        "rollout.max_tool_calls=3",
        "rollout.tree.initial_rollouts=2",
        "rollout.tree.expansion_iterations=1",
        "rollout.tree.beam_size=3",
        "rollout.tree.segment_tokens=40",
        "rollout.rollback.enable_tool_rollback=true",
        "episode.reward=token_f1",
        f"episode.batch_size={num_episodes}",
    ]


def make_demo_run(out_dir: str | Path, num_episodes: int = 3, extra: list[str] | None = None) -> Path:
    """Run ``num_episodes`` synthetic episodes through the real pipeline into ``out_dir``; returns ``out_dir``."""
    from memrl.config import load_config
    from memrl.episode.pipeline import run_episodes
    from memrl.testing import byte_tokenizer
    from memrl.testing.scripted import ScriptedPolicy

    cfg = load_config(None, demo_overrides(out_dir, num_episodes) + list(extra or []))
    policy: Any = ScriptedPolicy(byte_tokenizer(), demo_script, continue_plans=False)
    run_episodes(cfg, out_dir, policy=policy, progress=False)
    return Path(out_dir)
