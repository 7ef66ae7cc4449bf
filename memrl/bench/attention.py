"""``memrl bench attention``: the HF engine's CPU attention paths against torch's sdpa kernel, in one process.

Two workloads of a LoCoMo writer's evaluation, each timed with memrl's kernels and with torch's
``scaled_dot_product_attention`` in their place, the arms alternating over ``--repeats`` fresh prompts (median):

* ``tail``: the prefill of a prompt after its cached prefix (``--prefix-tokens`` cached, ``--tails`` new tokens:
  a 4-turn write and an answer prompt). memrl: :func:`~memrl.policy.engine.shared_attention.causal_tail_attention`
  (the prefix and the tail's causal square apart, merged by log-sum-exp); torch: one masked kernel.
* ``decode``: decode steps of a padded batch (``--decode`` as ``ROWSxTOKENS``: rows of about that many cached
  positions, ``--new-tokens`` each). memrl: :func:`~memrl.policy.engine.shared_attention.decode_attention`; torch: its
  sdpa with the padding mask. Reports the time per decode step and how many greedy rows came out identical.

Random-token prompts: speed does not depend on the text, but their flat next-token distributions make near-ties,
so greedy agreement here is a floor. The documented run: ``--model smollm2-135m --dtype bfloat16 --threads 2``.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time

from memrl.bench import BENCHES


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="memrl bench attention")
    parser.add_argument("--model", default="smollm2-135m", help="a model alias, an HF path or 'random'")
    parser.add_argument("--dtype", default="bfloat16", help="policy.dtype of the run")
    parser.add_argument("--prefix-tokens", type=int, default=142)  # the write and answer instructions
    parser.add_argument("--tails", default="480,1227", help="new tokens after the cached prefix")
    parser.add_argument("--decode", default="8x620,32x1350", help="ROWSxTOKENS decode batches")
    parser.add_argument("--new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--threads", type=int, default=0, help="torch threads (0 = chosen from the load: memrl.threads)"
    )
    return parser.parse_args(argv)


@contextlib.contextmanager
def torch_kernels(policy, on: bool):
    """With ``on``, attention runs torch's sdpa where memrl's CPU kernels would (the reference arm)."""
    from memrl.policy.engine import shared_attention

    if not on:
        yield
        return
    single = shared_attention._single_query
    shared_attention._single_query = lambda *_a: False
    policy.causal_tail_kwargs = dict
    try:
        yield
    finally:
        shared_attention._single_query = single
        del policy.causal_tail_kwargs


def _top(policy) -> int:
    """Random prompts draw token ids below this (the first 20,000 of a real vocabulary: ordinary words)."""
    return min(20000, int(policy.model.get_input_embeddings().weight.shape[0]))


def _tail(policy, rng: random.Random, prefix: tuple[int, ...], tail: int, repeats: int) -> dict:
    from memrl.policy.base import GenerationRequest, SamplingParams

    top = _top(policy)
    once = SamplingParams(temperature=0.0, max_tokens=1)
    times: dict[str, list[float]] = {"memrl": [], "torch": []}
    for _ in range(repeats):
        for arm in times:
            prompt = prefix + tuple(rng.randrange(3, top) for _ in range(tail))
            with torch_kernels(policy, arm == "torch"):
                t0 = time.perf_counter()
                [[out]] = policy.generate([GenerationRequest(prompt, once)])
                times[arm].append(time.perf_counter() - t0)
            if out.cached_tokens < len(prefix):
                raise RuntimeError(f"bench attention: the {len(prefix)}-token prefix was not cached")
    ms = {arm: 1000 * statistics.median(v) for arm, v in times.items()}
    return {
        "tail_tokens": tail,
        "memrl_ms": ms["memrl"],
        "torch_ms": ms["torch"],
        "speedup": ms["torch"] / ms["memrl"],
    }


def _decode(policy, rng: random.Random, rows: int, tokens: int, new: int, repeats: int) -> dict:
    from memrl.policy.base import GenerationRequest, SamplingParams

    top = _top(policy)
    step = policy._step
    spent = [0.0, 0]

    def timed(batch) -> None:
        t0 = time.perf_counter()
        step(batch)
        spent[0] += time.perf_counter() - t0
        spent[1] += 1

    policy._step = timed
    per_step: dict[str, list[float]] = {"memrl": [], "torch": []}
    same = 0
    params = SamplingParams(temperature=0.0, max_tokens=new)
    try:
        for _ in range(repeats):
            lengths = [rng.randrange(int(tokens * 0.9), int(tokens * 1.1)) for _ in range(rows)]
            prompts = [tuple(rng.randrange(3, top) for _ in range(n)) for n in lengths]
            outs = {}
            for arm in per_step:
                policy.invalidate_cache()
                spent[:] = [0.0, 0]
                with torch_kernels(policy, arm == "torch"):
                    got = policy.generate([GenerationRequest(p, params) for p in prompts])
                per_step[arm].append(spent[0] / max(1, spent[1]))
                outs[arm] = [o[0].token_ids for o in got]
            same += sum(a == b for a, b in zip(outs["memrl"], outs["torch"], strict=True))
    finally:
        del policy._step
    ms = {arm: 1000 * statistics.median(v) for arm, v in per_step.items()}
    return {
        "rows": rows,
        "cached_tokens": tokens,
        "memrl_step_ms": ms["memrl"],
        "torch_step_ms": ms["torch"],
        "speedup": ms["torch"] / ms["memrl"],
        "greedy_rows_identical": f"{same}/{rows * repeats}",
    }


@BENCHES.register("attention")
def bench_attention(argv: list[str]) -> dict:
    args = parse_args(argv)
    import torch

    from memrl.policy.base import GenerationRequest, SamplingParams
    from memrl.policy.config import PolicyConfig
    from memrl.policy.engine.hf import HFPolicy
    from memrl.threads import auto_threads

    torch.set_num_threads(args.threads or auto_threads())
    if args.model == "random":  # a tiny random Llama with grouped heads: tests and a quick look
        from memrl.testing import random_tiny_llama

        model, tok = random_tiny_llama(seed=0, num_attention_heads=4, num_key_value_heads=2)
        policy = HFPolicy.from_model(model.to(getattr(torch, args.dtype)), tok, PolicyConfig(model="random"))
    else:
        policy = HFPolicy(PolicyConfig(model=args.model, dtype=args.dtype))
    if policy.device.type != "cpu":
        raise SystemExit(
            "memrl bench attention: the kernels it compares are the CPU paths (policy.device=cpu)"
        )
    rng = random.Random(0)
    top = _top(policy)
    prefix = tuple(rng.randrange(3, top) for _ in range(args.prefix_tokens))
    policy.generate([GenerationRequest(prefix + (5,), SamplingParams(temperature=0.0, max_tokens=1))])
    tails = [_tail(policy, rng, prefix, int(t), args.repeats) for t in args.tails.split(",")]
    batches = []
    for spec in args.decode.split(","):
        rows, tokens = (int(x) for x in spec.lower().split("x"))
        batches.append(_decode(policy, rng, rows, tokens, args.new_tokens, args.repeats))
    return {"torch_threads": torch.get_num_threads(), **vars(args), "tail": tails, "decode": batches}
