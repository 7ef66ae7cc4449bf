"""``memrl bench rollout``: independent chains vs tree search (entropy and random expansion) at 16 leaves per
prompt, and tool rollback.

Part 1 (HF model, real forward passes): the same prompts (:mod:`memrl.bench.rollout_workloads`) through every
arm in one run, each seed interleaved so machine noise hits every arm alike:

- ``chain``: ``n`` independent samples (each prompt computed once: its samples share one request, so only a
  tree's shared *response* prefixes count as savings);
- ``tree``: tree search with entropy expansion (fork at the segment node where the model was uncertain);
- ``tree_random``: the same tree shape with random expansion (fork at any segment node).

Reported per arm: forwarded tokens (prefill + decode, as the backend reports them), generated (decoded) tokens
and wall time per leaf; the leaves' answers scored strict (``<answer>`` tag equals the gold) and lenient (gold in
the prose): best-of-n and mean, distinct answers per group and the share of groups with mixed rewards (the GRPO
signal). Ratios ``<arm> / chain`` per leaf (``token_ratio``, ``decode_token_ratio``, ``wall_ratio``; the
entropy tree's are the unprefixed headline keys).

Models: ``random`` (the default), a random-init tiny Llama from :mod:`memrl.testing` that measures the
machinery in seconds, or ``smollm2-135m`` (any model alias or HF path works) for answer quality.

Part 2 (scripted policy and scripted tools): an error-prone workload where every call is first written wrong;
response tokens with rollback vs. keeping the failed attempts in context.
"""

from __future__ import annotations

import argparse
import logging
import re
import time

from memrl.bench import BENCHES
from memrl.bench.rollout_workloads import WORKLOADS, Workload, build_workload, score_groups
from memrl.rollout import RollbackConfig, RolloutConfig, RolloutRequest, TreeConfig, run_rollout
from memrl.testing.scripted import ScriptedPolicy
from memrl.tools.base import ToolResult

logger = logging.getLogger(__name__)

PROMPT = (
    "<|system|>\nYou answer questions about the user's past conversations using the facts below.\n"
    "Facts:\n[1] 2023-05-08 Caroline went to a LGBTQ support group.\n[2] 2023-06-27 Melanie painted a sunrise.\n"
    "[3] 2023-07-12 Caroline is researching adoption agencies.\n<|user|>\nQuestion {i}: what did Caroline"
    " research?\n<|assistant|>\n"
)


def _policy(model: str, cache_tokens: int, max_batch_size: int = 32):
    from memrl.policy.config import PolicyConfig
    from memrl.policy.engine.hf import HFPolicy

    cfg = PolicyConfig(
        model=model if model != "random" else "random-tiny",
        seed=0,
        prefix_cache_tokens=cache_tokens,
        max_batch_size=max_batch_size,
    )
    if model == "random":
        from memrl.testing import random_tiny_llama

        net, tok = random_tiny_llama(seed=0)
        return HFPolicy.from_model(net, tok, cfg), "random-init tiny Llama"
    return HFPolicy(cfg), f"{model} (HF)"


def _measure(policy, work: Workload, cfg: RolloutConfig) -> dict:
    # Every arm starts cold: no prefix state kept from an earlier arm or repeat (HF keeps recent shared prompts).
    getattr(policy, "invalidate_cache", lambda: None)()
    start = time.perf_counter()
    result = run_rollout(work.requests, policy, work.tools, cfg)
    wall = time.perf_counter() - start
    leaves = sum(len(x) for x in result.leaves)
    distinct = sum(len({s.response_ids for s in x if not s.meta.is_duplicate}) for x in result.leaves)
    m = result.metrics
    return {
        "wall_s": wall,
        "leaves": leaves,
        "distinct_leaves_per_prompt": distinct / len(work.requests),
        "forwarded_tokens_per_leaf": m["rollout/forwarded_tokens"] / leaves,
        "decode_tokens_per_leaf": m["rollout/decode_tokens"] / leaves,
        "wall_s_per_leaf": wall / leaves,
        "prefix_hit_rate": m["rollout/prefix_hit_rate"],
        "generate_calls": m.get("rollout/generate_calls", 0.0),
        "stream_waits": m.get("rollout/stream_waits", 0.0),
        "mean_response_tokens": sum(len(s.response_ids) for x in result.leaves for s in x) / leaves,
        **score_groups(policy.tokenizer, result.leaves, work),
    }


def _tree_cfg(args, expansion_policy: str) -> TreeConfig:
    return TreeConfig(
        initial_rollouts=args.initial_rollouts,
        expansion_iterations=args.expansion_iterations,
        nodes_per_expansion=args.nodes_per_expansion,
        beam_size=args.beam_size,
        segment_tokens=args.segment_tokens,
        expansion_policy=expansion_policy,
    )


def _tree_vs_chain(args) -> dict:
    policy, model_name = _policy(args.model, args.prefix_cache_tokens, args.max_batch_size)
    if args.model == "random":
        # A random model samples eos at any step (~1/384 per token), so chain leaves end early while tree leaves,
        # forked from chains that survived, run longer: per-leaf numbers would compare unequal work. As in
        # `memrl bench policy`, the random model decodes to the length limit in both arms.
        policy.eos_ids = []
    work = build_workload(args.workload, policy.tokenizer, args.prompts, args.path)
    cfgs = _arm_configs(args, 0)
    per_seed = _measure_seeds(policy, work, args)
    res = {k: _mean(v) for k, v in per_seed.items()}
    c, t = res["chain"], res["tree"]
    out = {
        "model": model_name,
        "config": {
            "workload": args.workload,
            "prompts": len(work.requests),
            "prompt_tokens": sum(len(r.prompt_ids) for r in work.requests) / len(work.requests),
            "leaves_per_prompt": args.leaves,
            "max_response_tokens": args.max_tokens,
            "prefix_cache_tokens": args.prefix_cache_tokens,
            "max_batch_size": args.max_batch_size,
            "eos_disabled": args.model == "random",
            "arms": {k: _describe(v) for k, v in cfgs.items()},
            "seeds": args.seeds,
        },
        "prefix_cache_evictions": policy.prefix_cache.evictions,
        **res,
        **_ratios(c, t),
        **{f"{k}_per_seed": v for k, v in _per_seed_ratios(per_seed["chain"], per_seed["tree"]).items()},
        # Context: tree leaves may be longer than chain leaves (forks of long chains), so per leaf
        # understates the saving per generated response token.
        "token_ratio_per_response_token": (t["forwarded_tokens_per_leaf"] / t["mean_response_tokens"])
        / (c["forwarded_tokens_per_leaf"] / c["mean_response_tokens"]),
        "wall_ratio_per_response_token": (t["wall_s_per_leaf"] / t["mean_response_tokens"])
        / (c["wall_s_per_leaf"] / c["mean_response_tokens"]),
        "prefix_hit_rate": t["prefix_hit_rate"],
        "distinct_leaves": t["distinct_leaves_per_prompt"],
    }
    for arm in res:
        if arm.startswith("tree_"):
            out.update({f"{arm}_{k}": v for k, v in _ratios(c, res[arm]).items()})
    return out


def _describe(cfg: RolloutConfig) -> dict:
    if cfg.strategy == "chain":
        return {"strategy": "chain", "n": cfg.n}
    return {"strategy": "tree", **vars(cfg.tree)}


def _arm_configs(args, seed: int) -> dict[str, RolloutConfig]:
    """``chain`` (n independent samples), ``tree`` (entropy expansion) and ``tree_random`` (random expansion,
    same shape)."""
    common = dict(
        n=args.leaves,
        max_response_tokens=args.max_tokens,
        temperature=args.temperature,
        top_logprobs=5,
        seed=seed,
        max_tool_calls=2,
    )
    return {
        "chain": RolloutConfig(strategy="chain", **common),
        "tree": RolloutConfig(strategy="tree", tree=_tree_cfg(args, "entropy"), **common),
        "tree_random": RolloutConfig(strategy="tree", tree=_tree_cfg(args, "random"), **common),
    }


def _measure_seeds(policy, work: Workload, args) -> dict[str, list[dict]]:
    """Each arm's measurement (best of ``args.repeats``) for each of ``args.seeds`` sampling seeds.

    Where a tree forks depends on what it sampled, so one seed is one draw of its token count (it varies widely
    over seeds): every arm runs every seed, and the headline is the mean."""
    warm = Workload(work.requests[:1], work.tools, work.golds[:1], work.questions[:1])
    _measure(policy, warm, RolloutConfig(strategy="chain", n=2, max_response_tokens=8))
    per_seed: dict[str, list[dict]] = {}
    for seed in range(args.seeds):
        cfgs = _arm_configs(args, seed)
        runs: dict[str, list[dict]] = {k: [] for k in cfgs}
        for _ in range(args.repeats):  # interleaved, so machine noise hits every arm alike
            for name, cfg in cfgs.items():
                runs[name].append(_measure(policy, work, cfg))
                logger.info("seed %d, %s: %.1f s", seed, name, runs[name][-1]["wall_s"])
        for name, r in runs.items():
            per_seed.setdefault(name, []).append(_combine(r))
        logger.info("seed %d: %s", seed, {k: v[-1] for k, v in per_seed.items()})
    return per_seed


def _mean(runs: list[dict]) -> dict:
    return {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}


def _ratios(chain: dict, tree: dict) -> dict[str, float]:
    """Tree / chain per leaf: forwarded tokens, generated (decoded) tokens and wall time."""
    return {
        "token_ratio": tree["forwarded_tokens_per_leaf"] / chain["forwarded_tokens_per_leaf"],
        "decode_token_ratio": tree["decode_tokens_per_leaf"] / chain["decode_tokens_per_leaf"],
        "wall_ratio": tree["wall_s_per_leaf"] / chain["wall_s_per_leaf"],
    }


def _per_seed_ratios(chain: list[dict], tree: list[dict]) -> dict[str, list[float]]:
    per = [_ratios(c, t) for c, t in zip(chain, tree, strict=True)]
    return {k: [r[k] for r in per] for k in per[0]}


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

    def record_rollback(self, tool: str) -> None:
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
    args = parse_args(argv)
    out = _tree_vs_chain(args)
    out.update(_rollback_workload(args))
    return out


def parse_args(argv: list[str]) -> argparse.Namespace:
    return parser().parse_args(argv)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memrl bench rollout", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default="random",
        help="'random' (random-init tiny Llama, seconds), a model alias (smollm2-135m) or an HF path",
    )
    p.add_argument(
        "--prompts",
        type=int,
        default=32,
        help="prompts per rollout call. 32 x 16 leaves = 16 full batches: decode throughput bounds both arms, as in "
        "an RL rollout batch. At 8 (4 batches) the tree's own sequential depth (chain + 3 rounds) bounds its wall "
        "time instead (see docs/benchmarks.md)",
    )
    p.add_argument("--leaves", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=192)
    p.add_argument(
        "--max-batch-size",
        type=int,
        default=32,
        help="policy.max_batch_size: rows decoded together (the chain's prompts x leaves fit in one batch at "
        "prompts*leaves; at the policy default 32 its rows wait for free slots, continuous batching)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="interleaved chain/tree repeats; best wall time (noisy machines)",
    )
    p.add_argument("--seeds", type=int, default=4, help="sampling seeds; ratios are means over them")
    p.add_argument("--initial-rollouts", type=int, default=1)
    p.add_argument("--expansion-iterations", type=int, default=3)
    p.add_argument("--nodes-per-expansion", type=int, default=1)
    p.add_argument("--beam-size", type=int, default=6)
    p.add_argument("--segment-tokens", type=int, default=16)
    p.add_argument(
        "--temperature", type=float, default=1.0, help="sampling temperature of every arm (the same for all)"
    )
    p.add_argument(
        "--workload", default="synthetic", choices=WORKLOADS, help="see memrl.bench.rollout_workloads"
    )
    p.add_argument(
        "--path", help="dataset file for --workload locomo (default: the bundled 8-question fixture)"
    )
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=1 << 20,
        help="HF radix-cache budget (KV positions); evicted prefixes are recomputed (evictions are counted)",
    )
    p.add_argument("--calls", type=int, default=3, help="tool calls per response in the rollback workload")
    return p
