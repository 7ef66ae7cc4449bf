"""``memrl bench lora``: the decode step with a LoRA adapter, unfolded (PEFT's LoRA path) vs folded into the base
weights (``policy.merge_lora``, :mod:`memrl.policy.engine.lora_merge`), and the bare model for reference.

One batched ``generate`` of ``--batch`` rows, their prompts (``--prompt-tokens``) already in each arm's prefix
cache, ``--gen-tokens`` new tokens each: ``*_ms_per_step`` is its time divided by the decode steps. The arms run
interleaved, each timing the best of ``--repeats``. The folded arm's time includes folding the adapter in again
(another arm's forward unfolds it, as a training step's update does); ``fold_s`` times one fold alone.
``fold_speedup`` = unfolded / folded. On CUDA a fourth arm, ``graph``, is the folded one with each decode step
replayed from a captured CUDA graph (``policy.cuda_graphs``, :mod:`memrl.policy.engine.cuda_graphs`); the bench then
also decodes the prompts greedily through both and counts the rows whose tokens are identical. The adapter is LoRA on every linear layer (as ``configs/*`` train), its
``B`` random so the fold changes the weights. ``--model`` takes ``random`` (the tiny random Llama of ``memrl bench
policy``), an alias such as ``smollm2-135m`` or a model directory (e.g. a random-init copy of SmolLM2's shape on a
GPU machine that has no weights).
"""

from __future__ import annotations

import argparse
import time

from memrl.bench import BENCHES


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="memrl bench lora")
    parser.add_argument("--model", default="smollm2-135m", help="'random', a model alias or an HF path")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="policy.dtype (auto: bfloat16 on CUDA)")
    parser.add_argument("--compile", action="store_true", help="on CUDA, also the compiled graph arm")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=400)
    parser.add_argument("--gen-tokens", type=int, default=72)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0 = chosen from the load: memrl.threads)"
    )
    return parser.parse_args(argv)


def _arms(args):
    """The three policies over one PEFT model: bare (adapters disabled), unfolded, folded."""
    import dataclasses

    import torch

    from memrl.bench.policy import _policy
    from memrl.policy.config import PolicyConfig
    from memrl.policy.engine.hf import HFPolicy
    from memrl.train.config import LoraConfig
    from memrl.train.lora import attach_lora

    if args.model == "random":
        loaded = _policy(args.model)
    else:
        loaded = HFPolicy(PolicyConfig(model=args.model, device=args.device, dtype=args.dtype))
    model = attach_lora(loaded.model, LoraConfig(r=args.rank, alpha=2 * args.rank)).to(args.device).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.01)
    cfg = dataclasses.replace(loaded.cfg, device=args.device)
    arms = {}
    named = [("bare", False, False), ("unfolded", False, False), ("folded", True, False)]
    if args.device.startswith("cuda"):
        named.append(("graph", True, True))  # folded, each decode step replayed from a CUDA graph
        if args.compile:
            named.append(("compiled", True, "compile"))  # the same, of torch.compile's fused forward
    for name, merge, graphs in named:
        arm_cfg = dataclasses.replace(
            cfg, merge_lora=merge, cuda_graphs=bool(graphs), compile_decode=graphs == "compile"
        )
        arms[name] = HFPolicy.from_model(model, loaded.tokenizer, arm_cfg)
        arms[name].eos_ids = []  # every row decodes --gen-tokens tokens
    return model, arms


def _greedy_agreement(arms: dict, prompts: list, gen_tokens: int, other: str = "graph") -> dict:
    """Greedy tokens of the captured decode against the eager folded one: rows identical, and the tokens
    before each row's first difference."""
    from memrl.policy.base import GenerationRequest, SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=gen_tokens, stop_token_ids=())
    eager, graph = (
        [o[0].token_ids for o in arms[name].generate([GenerationRequest(p, greedy) for p in prompts])]
        for name in ("folded", other)
    )
    same_prefix = [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x))
        for x, y in zip(eager, graph, strict=True)
    ]
    return {
        "greedy_rows_identical": sum(x == y for x, y in zip(eager, graph, strict=True)),
        "greedy_rows": len(prompts),
        "greedy_tokens_before_first_difference": same_prefix,
    }


@BENCHES.register("lora")
def bench_lora(argv: list[str]) -> dict:
    args = parse_args(argv)
    import contextlib

    import torch

    from memrl.policy.base import GenerationRequest, SamplingParams
    from memrl.threads import auto_threads

    torch.set_num_threads(args.threads or auto_threads())
    model, arms = _arms(args)
    params = SamplingParams(temperature=1.0, max_tokens=args.gen_tokens, seed=0, stop_token_ids=())
    prime = SamplingParams(temperature=0.0, max_tokens=1, stop_token_ids=())
    prompts = [
        tuple(3 + (i * 31 + j * 7) % 250 for j in range(args.prompt_tokens)) for i in range(args.batch)
    ]

    def scope(name: str):
        return model.disable_adapter() if name == "bare" else contextlib.nullcontext()

    for name, policy in arms.items():  # untimed: each arm's cache holds the prompts, as after tree search
        with scope(name):
            policy.generate([GenerationRequest(p, prime) for p in prompts])
    warm_s = {}
    for name in (
        "graph",
        "compiled",
    ):  # untimed: graphs are captured (and compiled) at the first decode steps
        if name in arms:
            t0 = time.perf_counter()
            arms[name].generate([GenerationRequest(p, params) for p in prompts])
            warm_s[f"{name}_capture_s"] = time.perf_counter() - t0
    times: dict[str, list[float]] = {name: [] for name in arms}
    for _ in range(args.repeats):
        for name, policy in arms.items():
            with scope(name):
                t0 = time.perf_counter()
                policy.generate([GenerationRequest(p, params) for p in prompts])
                times[name].append(time.perf_counter() - t0)
    fold = arms["folded"].adapters.fold
    fold.restore()
    t0 = time.perf_counter()
    with fold.forward():
        pass
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    fold_s = time.perf_counter() - t0
    steps = args.gen_tokens
    best = {name: min(t) for name, t in times.items()}
    graph = {}
    if "graph" in arms:
        graph = {
            "graph_speedup_over_folded": best["folded"] / best["graph"],
            "graph_speedup_over_bare": best["bare"] / best["graph"],
            "graphs_captured": arms["graph"]._graphs.captures,
            **warm_s,
            **_greedy_agreement(arms, prompts, args.gen_tokens),
        }
        if "compiled" in arms:
            graph["compiled_speedup_over_folded"] = best["folded"] / best["compiled"]
            agree = _greedy_agreement(arms, prompts, args.gen_tokens, other="compiled")
            graph.update({f"compiled_{k}": v for k, v in agree.items()})
    return {
        **vars(args),
        "torch_threads": torch.get_num_threads(),
        "lora_layers": len(fold.layers),
        **{f"{name}_ms_per_step": 1000 * t / steps for name, t in best.items()},
        "fold_s": fold_s,
        "fold_speedup": best["unfolded"] / best["folded"],
        "bare_over_folded": best["bare"] / best["folded"],
        **graph,
    }
