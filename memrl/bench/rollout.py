"""``memrl bench rollout``: tree search vs independent chains at 16 leaves per prompt, and tool rollback.

Part 1 (tiny HF model, real forward passes): the same prompts through ``chain`` and ``tree`` in one run. The
chain baseline computes each prompt once too (its ``n`` samples share one request), so only the tree's shared
*response* prefixes count as savings. Reported per leaf: forwarded tokens (prefill + decode, as the backend
reports them) and wall time; plus the tree's prefix-cache hit rate and how many of its leaves are distinct.

Part 2 (scripted policy and scripted tools): an error-prone workload where every call is first written wrong;
response tokens with rollback vs. keeping the failed attempts in context.
"""

from __future__ import annotations

import argparse
import logging
import re
import time

from memrl.bench import BENCHES
from memrl.policy.scripted import ScriptedPolicy
from memrl.rollout import RollbackConfig, RolloutConfig, RolloutRequest, TreeConfig, run_rollout
from memrl.tools.base import ToolResult

logger = logging.getLogger(__name__)

PROMPT = (
    "<|system|>\nYou answer questions about the user's past conversations using the facts below.\n"
    "Facts:\n[1] 2023-05-08 Caroline went to a LGBTQ support group.\n[2] 2023-06-27 Melanie painted a sunrise.\n"
    "[3] 2023-07-12 Caroline is researching adoption agencies.\n<|user|>\nQuestion {i}: what did Caroline"
    " research?\n<|assistant|>\n"
)


def _policy(model: str, cache_tokens: int):
    from memrl.policy.config import PolicyConfig
    from memrl.policy.hf import HFPolicy

    cfg = PolicyConfig(
        model=model if model != "random" else "random-tiny", seed=0, prefix_cache_tokens=cache_tokens
    )
    if model == "random":
        from memrl.policy.tiny_arch import random_tiny_llama

        net, tok = random_tiny_llama(seed=0)
        return HFPolicy.from_model(net, tok, cfg), "random-init tiny Llama"
    return HFPolicy(cfg), f"{model} (HF)"


def _measure(policy, requests, cfg: RolloutConfig) -> dict:
    start = time.perf_counter()
    result = run_rollout(requests, policy, None, cfg)
    wall = time.perf_counter() - start
    leaves = sum(len(x) for x in result.leaves)
    distinct = sum(len({s.response_ids for s in x if not s.meta.is_duplicate}) for x in result.leaves)
    m = result.metrics
    return {
        "wall_s": wall,
        "leaves": leaves,
        "distinct_leaves_per_prompt": distinct / len(requests),
        "forwarded_tokens_per_leaf": m["rollout/forwarded_tokens"] / leaves,
        "decode_tokens_per_leaf": m["rollout/decode_tokens"] / leaves,
        "wall_s_per_leaf": wall / leaves,
        "prefix_hit_rate": m["rollout/prefix_hit_rate"],
        "prefix_misses": m.get("rollout/prefix_misses", 0.0),
        "generate_calls": m["rollout/generate_calls"],
        "mean_response_tokens": sum(len(s.response_ids) for x in result.leaves for s in x) / leaves,
    }


def _tree_vs_chain(args) -> dict:
    policy, model_name = _policy(args.model, args.prefix_cache_tokens)
    if args.model == "random":
        # A random model samples eos at any step (~1/384 per token), so chain leaves end early while tree leaves,
        # forked from chains that survived, run longer: per-leaf numbers would compare unequal work. As in
        # `memrl bench policy`, the random model decodes to the length limit in both arms.
        policy.eos_ids = []
    tok = policy.tokenizer
    requests = [
        RolloutRequest(tok.encode(PROMPT.format(i=i), add_special_tokens=False), f"q{i}")
        for i in range(args.prompts)
    ]
    common = dict(n=args.leaves, max_response_tokens=args.max_tokens, temperature=1.0, top_logprobs=5, seed=0)
    tree = TreeConfig(
        initial_rollouts=args.initial_rollouts,
        expansion_iterations=args.expansion_iterations,
        nodes_per_expansion=args.nodes_per_expansion,
        beam_size=args.beam_size,
        segment_tokens=args.segment_tokens,
        expansion_policy=args.expansion_policy,
    )
    chain_cfg = RolloutConfig(strategy="chain", **common)
    tree_cfg = RolloutConfig(strategy="tree", tree=tree, **common)
    _measure(policy, requests[:1], RolloutConfig(strategy="chain", n=2, max_response_tokens=8))  # warm-up
    chain, tree_r = [], []
    for _ in range(args.repeats):  # interleaved, so machine noise hits both alike
        chain.append(_measure(policy, requests, chain_cfg))
        tree_r.append(_measure(policy, requests, tree_cfg))
        logger.info("chain %s | tree %s", chain[-1], tree_r[-1])
    c, t = _combine(chain), _combine(tree_r)
    return {
        "model": model_name,
        "config": {
            "prompts": args.prompts,
            "prompt_tokens": len(requests[0].prompt_ids),
            "leaves_per_prompt": args.leaves,
            "max_response_tokens": args.max_tokens,
            "prefix_cache_tokens": args.prefix_cache_tokens,
            "eos_disabled": args.model == "random",
            "tree": dict(vars(tree)),
        },
        "prefix_cache_evictions": policy.prefix_cache.evictions,
        "chain": c,
        "tree": t,
        "token_ratio": t["forwarded_tokens_per_leaf"] / c["forwarded_tokens_per_leaf"],
        "wall_ratio": t["wall_s_per_leaf"] / c["wall_s_per_leaf"],
        # Context: tree leaves are often longer than chain leaves (forks of long chains), so per leaf
        # understates the saving per generated response token.
        "token_ratio_per_response_token": (t["forwarded_tokens_per_leaf"] / t["mean_response_tokens"])
        / (c["forwarded_tokens_per_leaf"] / c["mean_response_tokens"]),
        "prefix_hit_rate": t["prefix_hit_rate"],
        "distinct_leaves": t["distinct_leaves_per_prompt"],
    }


def _combine(runs: list[dict]) -> dict:
    """Token counts are the same every repeat (seeded); wall times take the best repeat (noise only adds)."""
    return {
        k: min(r[k] for r in runs) if k.startswith("wall") else sum(r[k] for r in runs) / len(runs)
        for k in runs[0]
    }


# ---------------------------------------------------------------------------------------------------------
# Rollback on a scripted error-prone workload.


def error_prone_script(calls: int):
    """Every call is first written wrong (``prnt``); after an error (fed back or left in context) the call is
    corrected; after ``calls`` good results it answers."""

    def script(ctx) -> str:
        resp = ctx.text.split("<|assistant|>\n", 1)[-1]
        ok = len(re.findall(r"<result>\d+</result>", resp))
        last = resp.rfind("<result>")
        if last >= 0 and not re.match(r"<result>\d+</result>", resp[last:]):
            return f"<python>print({ok + 1})</python>"
        if ok >= calls:
            return f"<answer>{ok}</answer>"
        return f"<python>prnt({ok + 1})</python>"

    return script


class _ScriptedTools:
    """``print(k)`` prints k; anything else is a NameError traceback (what the sandbox returns for ``prnt``)."""

    def record_retry(self, tool: str) -> None:
        pass

    def execute(self, calls):
        out = []
        for call, _ in calls:
            m = re.fullmatch(r"print\((\d+)\)", call.arguments.strip())
            if m:
                out.append(ToolResult(text=m.group(1), status="ok"))
            else:
                err = "NameError: name 'prnt' is not defined"
                out.append(
                    ToolResult(
                        text=f'Traceback (most recent call last):\n  File "<tool>"\n{err}',
                        status="error",
                        error=err,
                    )
                )
        return out


def _rollback_workload(args) -> dict:
    from transformers import ByT5Tokenizer

    tok = ByT5Tokenizer()
    requests = [
        RolloutRequest(tok.encode(PROMPT.format(i=i), add_special_tokens=False), f"r{i}") for i in range(4)
    ]
    lengths, responses = {}, {}
    for enabled in (True, False):
        cfg = RolloutConfig(
            strategy="chain",
            n=4,
            max_tool_calls=2 * args.calls + 1,
            max_response_tokens=2048,
            rollback=RollbackConfig(enable_tool_rollback=enabled),
        )
        result = run_rollout(
            requests, ScriptedPolicy(tok, error_prone_script(args.calls)), _ScriptedTools(), cfg
        )
        steps = [s for x in result.leaves for s in x]
        lengths[enabled] = sum(len(s.prompt_ids) + len(s.response_ids) for s in steps) / len(steps)
        responses[enabled] = sum(len(s.response_ids) for s in steps) / len(steps)
        if enabled:
            rb = result.metrics
    return {
        "rollback_context_ratio": lengths[True] / lengths[False],
        "rollback_response_ratio": responses[True] / responses[False],
        "rollback_context_tokens": lengths[True],
        "kept_failures_context_tokens": lengths[False],
        "rollbacks": rb["tools/rollbacks"],
        "rollback_repairs": rb["tools/rollback_repairs"],
    }


@BENCHES.register("rollout")
def bench_rollout(argv: list[str]) -> dict:
    p = argparse.ArgumentParser(prog="memrl bench rollout", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", default="random", help="'random' (random-init tiny Llama), 'tiny', or an HF path"
    )
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--leaves", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument("--repeats", type=int, default=3, help="interleaved chain/tree repeats; best wall time")
    p.add_argument("--initial-rollouts", type=int, default=1)
    p.add_argument("--expansion-iterations", type=int, default=3)
    p.add_argument("--nodes-per-expansion", type=int, default=1)
    p.add_argument("--beam-size", type=int, default=6)
    p.add_argument("--segment-tokens", type=int, default=16)
    p.add_argument("--expansion-policy", default="entropy")
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=1 << 20,
        help="HF KV budget for kept prefixes; a tree keeps one per node, evictions are recomputed (and counted)",
    )
    p.add_argument("--calls", type=int, default=3, help="tool calls per response in the rollback workload")
    args = p.parse_args(argv)
    out = _tree_vs_chain(args)
    out.update(_rollback_workload(args))
    return out
