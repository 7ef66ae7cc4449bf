"""``memrl bench rollout``: tree search vs independent chains at 16 leaves per prompt, and tool rollback.

Part 1 (HF model, real forward passes): the same prompts through ``chain`` and ``tree`` in one run. The
chain baseline computes each prompt once too (its ``n`` samples share one request), so only the tree's shared
*response* prefixes count as savings. Reported per leaf: forwarded tokens (prefill + decode, as the backend
reports them) and wall time; plus the tree's prefix-cache hit rate and how many of its leaves are distinct.
When the arms' leaves differ in length (a model with eos: tree forks may land where text runs on),
``token_ratio_per_response_token`` / ``wall_ratio_per_response_token`` give the same ratios per response token.
The tree runs with ``--branch-at`` (headline keys) and, in the same run, with the other granularity
(``tree_<other>`` and ``alt_token_ratio`` / ``alt_wall_ratio``).

Models: ``smollm2-135m`` (the default; any model alias or HF path works) or ``random``, a random-init tiny
Llama from :mod:`memrl.testing` that measures the machinery in seconds. Workloads: ``locomo`` (one
LoCoMo-style prompt per request, no tools) or ``synthetic`` (test-split synthetic episodes, each prompt built by
the episode pipeline's :class:`~memrl.episode.prompt.PromptBuilder` from its gold facts and latest turns,
``<python>`` calls answered by a safe arithmetic evaluator, so tool turns are real but cost no sandbox process).

Part 2 (scripted policy and scripted tools): an error-prone workload where every call is first written wrong;
response tokens with rollback vs. keeping the failed attempts in context.
"""

from __future__ import annotations

import argparse
import ast
import logging
import operator
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


def _policy(model: str, cache_tokens: int, max_batch_size: int = 32):
    from memrl.policy.config import PolicyConfig
    from memrl.policy.hf import HFPolicy

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


def _measure(policy, requests, tools, cfg: RolloutConfig) -> dict:
    # Every arm starts cold: no prefix state kept from an earlier arm or repeat (HF keeps recent shared prompts).
    getattr(policy, "invalidate_cache", lambda: None)()
    start = time.perf_counter()
    result = run_rollout(requests, policy, tools, cfg)
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
        "generate_calls": m.get("rollout/generate_calls", 0.0),
        "stream_waits": m.get("rollout/stream_waits", 0.0),
        "mean_response_tokens": sum(len(s.response_ids) for x in result.leaves for s in x) / leaves,
    }


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def arithmetic_tool(code: str) -> str:
    """Runs ``print(<integer arithmetic>)`` and nothing else, by evaluating its AST (no code is executed): the
    synthetic task's programs are one such line, and the bench times generation, not the sandbox."""

    def ev(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("unsupported")

    try:
        tree = ast.parse(code.strip(), mode="eval").body
        if not (
            isinstance(tree, ast.Call) and getattr(tree.func, "id", None) == "print" and len(tree.args) == 1
        ):
            raise ValueError("not a print call")
        return str(ev(tree.args[0]))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"Error: {exc}"


class ArithmeticTools:
    """``<python>`` calls answered by :func:`arithmetic_tool`."""

    def record_rollback(self, tool: str) -> None:
        pass

    def execute(self, calls):
        return [ToolResult(text=arithmetic_tool(call.arguments), status="ok") for call, _ in calls]


def synthetic_prompts(tok, n: int, facts_per_prompt: int = 4) -> list[tuple[int, ...]]:
    """Target-turn prompt ids of ``n`` test-split synthetic episodes, built as the episode runner builds them
    (:class:`~memrl.episode.prompt.PromptBuilder`, default episode config, ``python`` tool). The facts stand in
    for retrieval without running the memory: the gold evidence turns plus the latest other turns up to
    ``facts_per_prompt``, rule-extractor text, oldest first."""
    from memrl.data.adapters import run_adapter
    from memrl.episode.config import EpisodeConfig
    from memrl.episode.prompt import PromptBuilder, order_facts
    from memrl.memory.extract import rule_fact_texts

    episodes, _ = run_adapter("synthetic", None, split="test", options={"num_episodes": n, "seed": 0})
    cfg = EpisodeConfig()
    builder = PromptBuilder(cfg, tok)
    prompts = []
    for ep in episodes:
        gold = set(ep.metadata.get("evidence_turn_ids", ()))
        history = list(enumerate(ep.history))
        picked = [(i, t) for i, t in history if t.turn_id in gold]
        others = [(i, t) for i, t in reversed(history) if t.turn_id not in gold]
        picked += others[: max(0, facts_per_prompt - len(picked))]
        facts = [
            {"id": i, "text": text, "timestamp": t.timestamp, "speaker": t.speaker, "source_ids": [t.turn_id]}
            for i, t in picked
            for text in rule_fact_texts(t)[:1]
        ]
        prompts.append(builder.build(ep.final_query, order_facts(facts, cfg.fact_order), "", ["python"]).ids)
    return prompts


def _workload(name: str, tok, prompts: int) -> tuple[list[RolloutRequest], object]:
    if name == "locomo":
        reqs = [
            RolloutRequest(tok.encode(PROMPT.format(i=i), add_special_tokens=False), f"q{i}")
            for i in range(prompts)
        ]
        return reqs, None
    if name != "synthetic":
        raise ValueError(f"memrl bench rollout --workload: unknown {name!r}; valid: locomo, synthetic")
    reqs = [RolloutRequest(ids, f"q{i}") for i, ids in enumerate(synthetic_prompts(tok, prompts))]
    return reqs, ArithmeticTools()


def _tree_cfg(args, branch_at: str) -> TreeConfig:
    return TreeConfig(
        initial_rollouts=args.initial_rollouts,
        expansion_iterations=args.expansion_iterations,
        nodes_per_expansion=args.nodes_per_expansion,
        beam_size=args.beam_size,
        segment_tokens=args.segment_tokens,
        expansion_policy=args.expansion_policy,
        branch_at=branch_at,
    )


def _tree_vs_chain(args) -> dict:
    policy, model_name = _policy(args.model, args.prefix_cache_tokens, args.max_batch_size)
    if args.model == "random":
        # A random model samples eos at any step (~1/384 per token), so chain leaves end early while tree leaves,
        # forked from chains that survived, run longer: per-leaf numbers would compare unequal work. As in
        # `memrl bench policy`, the random model decodes to the length limit in both arms.
        policy.eos_ids = []
    requests, tools = _workload(args.workload, policy.tokenizer, args.prompts)
    other = "segment" if args.branch_at == "token" else "token"
    per_seed = _measure_seeds(policy, requests, tools, args, other)
    res = {k: _mean(v) for k, v in per_seed.items()}
    c, t, o = res["chain"], res["tree"], res[f"tree_{other}"]
    return {
        "model": model_name,
        "config": {
            "workload": args.workload,
            "prompts": args.prompts,
            "prompt_tokens": len(requests[0].prompt_ids),
            "leaves_per_prompt": args.leaves,
            "max_response_tokens": args.max_tokens,
            "prefix_cache_tokens": args.prefix_cache_tokens,
            "max_batch_size": args.max_batch_size,
            "eos_disabled": args.model == "random",
            "tree": dict(vars(_tree_cfg(args, args.branch_at))),
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
        "alt_branch_at": other,
        **{f"alt_{k}": v for k, v in _ratios(c, o).items()},
    }


def _arm_configs(args, seed: int, other: str) -> dict[str, RolloutConfig]:
    common = dict(
        n=args.leaves,
        max_response_tokens=args.max_tokens,
        temperature=1.0,
        top_logprobs=5,
        seed=seed,
        max_tool_calls=2,
    )
    cfgs = {"chain": RolloutConfig(strategy="chain", **common)}
    for name, at in (("tree", args.branch_at), (f"tree_{other}", other)):
        cfgs[name] = RolloutConfig(strategy="tree", tree=_tree_cfg(args, at), **common)
    return cfgs


def _measure_seeds(policy, requests, tools, args, other: str) -> dict[str, list[dict]]:
    """Each arm's measurement (best of ``args.repeats``) for each of ``args.seeds`` sampling seeds.

    Where a tree forks depends on what it sampled, so one seed is one draw of its token count (the random-init
    model's token ratio spans ~0.45-0.64 over seeds): every arm runs every seed, and the headline is the mean."""
    _measure(policy, requests[:1], tools, RolloutConfig(strategy="chain", n=2, max_response_tokens=8))
    per_seed: dict[str, list[dict]] = {}
    for seed in range(args.seeds):
        cfgs = _arm_configs(args, seed, other)
        runs: dict[str, list[dict]] = {k: [] for k in cfgs}
        for _ in range(args.repeats):  # interleaved, so machine noise hits every arm alike
            for name, cfg in cfgs.items():
                runs[name].append(_measure(policy, requests, tools, cfg))
        for name, r in runs.items():
            per_seed.setdefault(name, []).append(_combine(r))
        logger.info("seed %d: %s", seed, {k: v[-1] for k, v in per_seed.items()})
    return per_seed


def _mean(runs: list[dict]) -> dict:
    return {k: sum(r[k] for r in runs) / len(runs) for k in runs[0]}


def _ratios(chain: dict, tree: dict) -> dict[str, float]:
    """Tree / chain per leaf: forwarded tokens and wall time."""
    return {
        "token_ratio": tree["forwarded_tokens_per_leaf"] / chain["forwarded_tokens_per_leaf"],
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
    args = parser().parse_args(argv)
    out = _tree_vs_chain(args)
    out.update(_rollback_workload(args))
    return out


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memrl bench rollout", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="a model alias (smollm2-135m) or HF path, or 'random' (random-init tiny Llama, seconds)",
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
    p.add_argument("--expansion-policy", default="entropy")
    p.add_argument(
        "--branch-at",
        default="token",
        choices=["token", "segment"],
        help="headline tree granularity (the other one is measured too: alt_* keys)",
    )
    p.add_argument("--workload", default="locomo", help="'locomo' (one prompt, no tools) or 'synthetic'")
    p.add_argument(
        "--prefix-cache-tokens",
        type=int,
        default=1 << 20,
        help="HF KV budget for kept prefixes; a tree keeps one per node, evictions are recomputed (and counted)",
    )
    p.add_argument("--calls", type=int, default=3, help="tool calls per response in the rollback workload")
    return p
