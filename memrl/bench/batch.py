"""``memrl bench batch``: padding waste and forward+backward speed of packed vs padded training batches.

Builds a multi-turn batch with long-tail (log-normal) prompt/response lengths through
:class:`~memrl.data.batch.TrajectoryBatchBuilder` (history steps present and dropped, as in real episodes),
then runs a randomly initialised tiny ``LlamaForCausalLM`` (byte vocab 384) forward+backward over

* **padded**: verl's layout, every row padded to ``max_prompt + max_response``, ``micro_batch`` rows per call;
* **packed**: the same rows placed into bins (:func:`~memrl.data.packing.plan_bins`, capacity = the longest
  row) with a block-diagonal causal mask, ``micro_batch`` bins per call.

Both passes see the same real tokens, in the same run, alternating; ``packed_speedup`` is the ratio of the
best padded time to the best packed time. ``loss_rel_diff`` compares the summed response NLL of the two.
``padding_fraction_packed`` counts the bin slack actually computed by the packed pass (the packed layout
itself has none: ``padding_fraction_packed_layout``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from memrl.bench import BENCHES
from memrl.data.batch import TrajectoryBatchBuilder, select_steps, slice_padded
from memrl.data.config import BatchConfig
from memrl.data.packing import _bin_tensors, packed_forward_logprobs, padded_forward_logprobs, plan_bins
from memrl.types import EpisodeStatus, EpisodeTrajectory, PackedBatch, StepTrajectory, TurnRole

VOCAB = 384  # transformers.ByT5Tokenizer: 256 bytes + 3 specials, padded up


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="memrl bench batch", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=64, help="trainable (target-turn) steps in the batch")
    p.add_argument("--targets-per-episode", type=int, default=4)
    p.add_argument("--prompt-median", type=float, default=48)
    p.add_argument("--response-median", type=float, default=24)
    p.add_argument("--sigma", type=float, default=0.9, help="log-normal sigma of both length distributions")
    p.add_argument("--max-len", type=int, default=1024, help="clip for each of prompt/response length")
    # Defaults sized for a shared 2-core CPU (~1 min); --layers 4 --hidden 256 is the bigger variant.
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=8, help="rows (padded) or bins (packed) per forward")
    p.add_argument("--repeats", type=int, default=2, help="timed passes per layout (best is reported)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def make_episodes(args: argparse.Namespace) -> list[EpisodeTrajectory]:
    """Episodes of one history step (dropped by the builder) + ``targets_per_episode`` target steps."""
    rng = np.random.default_rng(args.seed)

    def lengths(median: float) -> int:
        return int(np.clip(rng.lognormal(np.log(median), args.sigma), 1, args.max_len))

    def step(sid: str, role: TurnRole) -> StepTrajectory:
        p, r = lengths(args.prompt_median), lengths(args.response_median)
        mask = (rng.random(r) > 0.1).astype(int).tolist()  # ~10 % tool-output tokens (mask 0)
        return StepTrajectory(
            step_id=sid,
            prompt_ids=rng.integers(3, 259, p).tolist(),
            response_ids=rng.integers(3, 259, r).tolist(),
            response_mask=mask,
            logprobs=(-rng.random(r) * np.array(mask)).tolist(),
            turn_id=sid,
            turn_role=role,
        )

    episodes = []
    n_eps = -(-args.steps // args.targets_per_episode)
    for e in range(n_eps):
        n_targets = min(args.targets_per_episode, args.steps - e * args.targets_per_episode)
        steps = [step(f"e{e}/h0", TurnRole.HISTORY)]
        steps += [step(f"e{e}/t{k}", TurnRole.TARGET) for k in range(n_targets)]
        episodes.append(
            EpisodeTrajectory(
                episode_id=f"e{e}",
                group_id=f"g{e // 4}",
                steps=tuple(steps),
                reward=float(rng.integers(0, 2)),
                status=EpisodeStatus.COMPLETED,
            )
        )
    return episodes


def _tiny_llama(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 4,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.heads,
        max_position_embeddings=2 * args.max_len + 8,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config).float().train()


def _run_padded(model: torch.nn.Module, batch: PackedBatch, micro: int) -> tuple[float, float]:
    """Forward+backward over padded micro-batches; returns (seconds, summed response NLL)."""
    model.zero_grad(set_to_none=True)
    t0, total = time.perf_counter(), 0.0
    for start in range(0, batch.num_steps, micro):
        # Full batch width: "padded-to-max", as verl's fixed prompt/response lengths do.
        mb = slice_padded(batch, start, start + micro)
        loss = -(padded_forward_logprobs(model, mb) * mb.response_mask).sum()
        loss.backward()
        total += float(loss.detach())
    return time.perf_counter() - t0, total


def _run_packed(model: torch.nn.Module, batch: PackedBatch, bins: list[list[int]], micro: int, cap: int):
    model.zero_grad(set_to_none=True)
    t0, total = time.perf_counter(), 0.0
    for start in range(0, len(bins), micro):
        rows = sorted(i for b in bins[start : start + micro] for i in b)
        mb = select_steps(batch, rows)
        lp = packed_forward_logprobs(model, mb, bin_capacity=cap, bins_per_forward=micro)
        loss = -(lp * mb.response_mask).sum()
        loss.backward()
        total += float(loss.detach())
    return time.perf_counter() - t0, total


@BENCHES.register("batch")
def bench_batch(argv: list[str]) -> dict:
    args = _parse(argv)
    episodes = make_episodes(args)
    builder = TrajectoryBatchBuilder(BatchConfig(layout="packed"))
    t0 = time.perf_counter()
    packed = builder.build(episodes)
    build_packed_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    padded = builder.build(episodes, layout="padded")
    build_padded_s = time.perf_counter() - t0

    lengths = (packed.prompt_lengths + packed.response_lengths).tolist()
    real = int(sum(lengths))
    cap = max(lengths)
    bins = plan_bins(lengths, cap)
    computed_packed = sum(
        _bin_tensors(packed, bins[s : s + args.micro_batch], 0)[0].numel()
        for s in range(0, len(bins), args.micro_batch)
    )
    model = _tiny_llama(args)
    _run_padded(model, select_steps(padded, range(min(2, padded.num_steps))), args.micro_batch)  # warm-up
    _run_packed(model, packed, bins[:1], args.micro_batch, cap)
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    losses: dict[str, float] = {}
    for _ in range(args.repeats):
        t, losses["padded"] = _run_padded(model, padded, args.micro_batch)
        times["padded"].append(t)
        t, losses["packed"] = _run_packed(model, packed, bins, args.micro_batch, cap)
        times["packed"].append(t)
    best = {k: min(v) for k, v in times.items()}
    return {
        "padding_fraction_padded": 1.0 - real / padded.input_ids.numel(),
        "padding_fraction_packed": 1.0 - real / computed_packed,
        "padding_fraction_packed_layout": 1.0 - real / packed.input_ids.numel(),
        "packed_speedup": best["padded"] / best["packed"],
        "loss_rel_diff": abs(losses["packed"] - losses["padded"]) / max(abs(losses["padded"]), 1e-12),
        "tokens_per_s_padded": real / best["padded"],
        "tokens_per_s_packed": real / best["packed"],
        "loss_padded": losses["padded"],
        "loss_packed": losses["packed"],
        "num_steps": packed.num_steps,
        "real_tokens": real,
        "padded_shape": list(padded.input_ids.shape),
        "packed_bins": len(bins),
        "bin_capacity": cap,
        "build_seconds": {"packed": build_packed_s, "padded": build_padded_s},
        "seconds": times,
        "model": {"layers": args.layers, "hidden": args.hidden, "heads": args.heads, "vocab": VOCAB},
        "torch_threads": torch.get_num_threads(),
    }
