"""``memrl bench episodes``: episodes/s with the batch advancing together vs one episode at a time.

Same runner, same episodes, same run: a warm-up batch, then ``--episodes`` synthetic episodes batched (one
extraction/encode call per phase, one rollout call whose generate calls cover every episode), then the same
episodes one at a time. Reports the end-to-end ratio, the generation-phase ratio (tool wall time excluded),
the share of batched wall time in memory / generation / tools, and memory ingestion speed relative to a bare
batched MiniLM ``encode`` of the same history texts.

JSON keys: ``batched_speedup``, ``generation_batched_speedup``, ``share_memory``, ``share_generation``,
``share_tools``, ``memory_encode_ratio`` (+ context: times, episodes, model).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from memrl.bench import BENCHES

PHASES = ("ingest", "prompt", "generate", "update", "score")


def _random_tiny_llama(path: str) -> str:
    """A random-init tiny byte-level Llama from :mod:`memrl.testing`, saved to ``path`` (a run's config names a
    model by path). 3 layers of width 128: the phases' shares stay comparable with earlier runs of this bench."""
    from memrl.testing import random_tiny_llama

    model, tok = random_tiny_llama(
        seed=0, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_key_value_heads=4
    )
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _model(choice: str, tmp: str) -> tuple[str, str]:
    """``(policy.model, description)``: ``random`` is saved under ``tmp``; an alias or path passes through."""
    if choice == "random":
        return _random_tiny_llama(tmp), "random-init tiny llama"
    return choice, choice


def _timed_run(runner: Any, batches: Sequence[Sequence[Any]]) -> tuple[float, dict[str, float]]:
    """Wall time and phase times over the run, read from the runner's metrics like a ``metrics.json``; the
    policy's forward counters are lifetime totals, so their change over the run (``forward_calls``,
    ``forward_s``; zero for backends that do not count)."""
    runner.metrics.clear()
    before = runner.snapshot_metrics()
    t0 = time.perf_counter()
    for batch in batches:
        runner.run_batch(list(batch))
    wall = time.perf_counter() - t0
    after = runner.snapshot_metrics()
    out = {p: after.get(f"episode/time_{p}_s", 0.0) for p in (*PHASES, "tools")}
    for name, key in (("forward_calls", "policy/forward_calls"), ("forward_s", "policy/forward_seconds")):
        out[name] = after.get(key, 0.0) - before.get(key, 0.0)
    return wall, out


def _bare_embedder(runner: Any) -> Any:
    """The runner's embedder without the cache wrapper (the bench times real encodes)."""
    return getattr(runner.memory.embedder, "inner", runner.memory.embedder)


def _encode_ratio(runner: Any, inputs: Sequence[Any], repeats: int = 2) -> float:
    """Bare batched ``encode`` time / batched memory ingestion time for the same history texts.

    Ingestion (rule extraction + one encode call + FAISS adds) goes into fresh namespaces each repeat; the two
    measurements alternate and the best of ``repeats`` is kept for both (the machine is shared and noisy).
    """
    from memrl.memory.extract import rule_fact_texts

    mem = runner.memory
    texts = [t for bi in inputs for turn in bi.history for t in rule_fact_texts(turn)]
    inner = _bare_embedder(runner)
    bare, ingest = float("inf"), float("inf")
    for r in range(repeats):
        t0 = time.perf_counter()
        inner.encode(texts)
        bare = min(bare, time.perf_counter() - t0)
        mgrs = [mem.manager(f"encode-bench-{r}-{i}") for i in range(len(inputs))]
        t0 = time.perf_counter()
        mem.extract_facts_batch(
            [(m, turn) for m, bi in zip(mgrs, inputs, strict=True) for turn in bi.history]
        )
        ingest = min(ingest, time.perf_counter() - t0)
        for m in mgrs:
            mem.release(m.episode_id)
    return bare / ingest if ingest > 0 else 0.0


def _forward_split(ph_b: dict[str, float], ph_s: dict[str, float]) -> dict[str, float]:
    """Split the generation speed-up: ``generation_forward_ratio`` = sequential / batched forward count (the
    speed-up if a forward cost the same at every batch size, as on an accelerator far from saturation: the
    ceiling this workload's step counts set), ``forward_cost_ratio`` = mean batched / mean sequential forward
    time (what batching costs per forward on this machine), and each mode's share of generation time (tools
    excluded) spent inside model forwards."""
    calls_b, calls_s = ph_b["forward_calls"], ph_s["forward_calls"]
    if not calls_b or not calls_s:
        return {}
    gen_b, gen_s = ph_b["generate"] - ph_b["tools"], ph_s["generate"] - ph_s["tools"]
    return {
        "generation_forward_ratio": calls_s / calls_b,
        "forward_cost_ratio": (ph_b["forward_s"] / calls_b) / (ph_s["forward_s"] / calls_s),
        "forward_share_generation_batched": ph_b["forward_s"] / gen_b if gen_b > 0 else 0.0,
        "forward_share_generation_sequential": ph_s["forward_s"] / gen_s if gen_s > 0 else 0.0,
    }


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="memrl bench episodes")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--n", type=int, default=2, help="leaves per episode (rollout.n)")
    ap.add_argument("--max-tokens", type=int, default=48, help="rollout.max_response_tokens")
    ap.add_argument(
        "--model",
        default="smollm2-135m",
        help="a model alias (smollm2-135m) or HF path, or 'random' (random-init tiny Llama, seconds)",
    )
    ap.add_argument("--tools", default="python", help="comma-separated tools ('' = none)")
    ap.add_argument("overrides", nargs="*", help="config overrides, e.g. rollout.n=8")
    return ap.parse_args(argv)


@BENCHES.register("episodes")
def bench_episodes(argv: list[str]) -> dict:
    args = parse_args(argv)

    from memrl.config import load_config
    from memrl.data.adapters import load_dataset
    from memrl.episode.build import build_runner

    with tempfile.TemporaryDirectory(prefix="memrl-bench-episodes-") as tmp:
        model, model_desc = _model(args.model, tmp)
        tools = [t for t in args.tools.split(",") if t]
        cfg = load_config(
            None,
            [
                f"policy.model={model}",
                "data.adapter=synthetic",
                "data.split=test",
                f"data.options={{num_episodes: {args.episodes + 2}}}",
                f"tools.enabled=[{', '.join(tools)}]",
                f"rollout.n={args.n}",
                "rollout.temperature=1.0",
                f"rollout.max_response_tokens={args.max_tokens}",
                "memory.top_k=4",
                f"episode.batch_size={args.episodes}",
                *args.overrides,
            ],
        )
        inputs, _ = load_dataset(cfg.data)
        warm, work = inputs[:2], inputs[2:]
        runner = build_runner(cfg, cache_embeddings=False)
        try:
            runner.run_batch(warm)
            t_batch, ph_b = _timed_run(runner, [work])
            t_seq, ph_s = _timed_run(runner, [[bi] for bi in work])
            encode_ratio = _encode_ratio(runner, work)
            embedder_dtype = getattr(_bare_embedder(runner), "dtype", "float32")
        finally:
            if runner.tools is not None:
                runner.tools.close()
    gen_b, gen_s = ph_b["generate"] - ph_b["tools"], ph_s["generate"] - ph_s["tools"]
    total_b = sum(ph_b[p] for p in PHASES)
    memory_b = ph_b["ingest"] + ph_b["prompt"] + ph_b["update"]
    return {
        "batched_speedup": t_seq / t_batch,
        "generation_batched_speedup": gen_s / gen_b if gen_b > 0 else 0.0,
        **_forward_split(ph_b, ph_s),
        "share_memory": memory_b / total_b,
        "share_generation": gen_b / total_b,
        "share_tools": ph_b["tools"] / total_b,
        "memory_encode_ratio": encode_ratio,
        "episodes": len(work),
        "leaves_per_episode": cfg.rollout.n,  # overrides win over --n
        "model": model_desc,
        "embedder_dtype": embedder_dtype,
        "batched_s": t_batch,
        "sequential_s": t_seq,
        "batched_episodes_per_s": len(work) / t_batch,
        "sequential_episodes_per_s": len(work) / t_seq,
        "phase_s_batched": ph_b,
        "phase_s_sequential": ph_s,
    }
