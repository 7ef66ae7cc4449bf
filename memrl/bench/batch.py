"""``memrl bench batch``: forward+backward speed of the trainer's shared-prefix micro-batches on GRPO-shaped batches.

Builds GRPO groups shaped like ``configs/synthetic_chain.yaml`` (``--groups`` prompts of ``--prompt-min`` to
``--prompt-max`` tokens, ``--group-size`` responses of up to ``--response-max`` tokens each, every response of a
group after the same prompt) through :class:`~memrl.data.batch.TrajectoryBatchBuilder`, then runs, on a
random-init model of SmolLM2-135M's shape with ``--layers`` of its 30 layers (2 by default: the run
docs/benchmarks.md reports; 30 builds the full depth, ~13 GB of memory and minutes per pass) with the trainer's LoRA adapter
attached, forward (:func:`~memrl.train.microbatch.forward_logits` → :func:`~memrl.train.microbatch.token_logprobs`)
and backward of the summed response NLL over two micro-batchings of the same records:

* ``shared_prefix``: the trainer's own (:func:`~memrl.train.microbatch.split_micro_batches`): each group's prompt
  once, its cache repeated for the group's ≤ ``micro_batch_size`` responses;
* ``padded``: the reference without prefix sharing: ``micro_batch_size`` consecutive sequences per forward as
  right-padded rows (:func:`~memrl.train.microbatch.collate`);
* ``per_row``: one micro-batch per sequence (what the trainer did for rows of distinct prompts before it
  gathered those that start alike);
* ``checkpointed``: ``shared_prefix`` with the prompt forwarded under activation checkpointing
  (``train.checkpoint_prompt_tokens``), the trainer's layout for LoCoMo's 7.9 K-token prompts.

``--paths`` picks some of them (the padded reference stays the speedup's base when it runs, else the first path).
``saved_mb`` is the most memory autograd keeps for one micro-batch's backward (distinct storages saved by the
forward), the part of the update's peak that grows with the prompt: e.g. ``--layers 30 --groups 1 --group-size 8
--prompt-min 7900 --prompt-max 7900 --response-max 48 --paths shared_prefix,checkpointed --repeats 1``.

``--common-prefix N`` shapes the batch like memory writes instead: every sequence has a prompt of its own that
starts with the same ``N`` tokens (the write instructions), e.g. ``--groups 1 --group-size 9 --common-prefix 156
--prompt-min 300 --prompt-max 360 --response-max 48`` for the 9 write rows of a ``configs/synthetic_memory.yaml``
update.

The two run alternating in one process; each reports its best time. ``speedup`` is the padded reference's wall
time over each path's; ``cpu_speedup`` is the same with the process's CPU time, which a loaded machine disturbs
less (hence one thread by default: idle OpenMP threads spin). ``loss_rel_diff`` is the relative difference of the
two summed losses (the same tokens through the same model: float noise). ``forwarded_tokens`` counts what each
path feeds the model (padding included, a shared prompt once).
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator

import numpy as np
import torch

from memrl.bench import BENCHES
from memrl.data.batch import TrajectoryBatchBuilder
from memrl.episode.pipeline import peak_rss_mb
from memrl.threads import auto_threads
from memrl.train.config import LoraConfig, TrainConfig
from memrl.train.microbatch import (
    MicroBatch,
    SeqRecord,
    checkpoint_prompts,
    collate,
    collate_shared,
    forward_logits,
    seq_records,
    split_micro_batches,
    token_logprobs,
)
from memrl.types import EpisodeStatus, EpisodeTrajectory, PackedBatch, StepTrajectory, TurnRole

# SmolLM2-135M: the model the shipped training configs train.
SMOLLM2_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
}


PATHS = ("shared_prefix", "padded", "per_row", "checkpointed")


def parse_args(argv: list[str]) -> argparse.Namespace:
    train = TrainConfig()
    p = argparse.ArgumentParser(prog="memrl bench batch", description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=4, help="prompts per batch (data.prompts_per_batch)")
    p.add_argument("--group-size", type=int, default=8, help="responses per prompt (rollout.n)")
    p.add_argument("--prompt-min", type=int, default=300)
    p.add_argument("--prompt-max", type=int, default=600)
    p.add_argument("--response-max", type=int, default=96, help="rollout.max_response_tokens")
    depth = SMOLLM2_135M["num_hidden_layers"]
    p.add_argument(
        "--layers", type=int, default=2, help=f"layers of SmolLM2-135M's {depth} (full depth: {depth})"
    )
    p.add_argument(
        "--hidden", type=int, default=SMOLLM2_135M["hidden_size"], help="model width (heads scale)"
    )
    p.add_argument(
        "--common-prefix", type=int, default=0, help="memory-write shape: distinct prompts sharing N tokens"
    )
    p.add_argument("--micro-batch-size", type=int, default=train.micro_batch_size)
    p.add_argument("--repeats", type=int, default=2, help="timed passes per path (best is reported)")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (0 = chosen from the load: memrl.threads)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--paths", default="shared_prefix,padded,per_row", help=f"comma-separated, of {', '.join(PATHS)}"
    )
    args = p.parse_args(argv)
    args.paths = [x.strip() for x in args.paths.split(",") if x.strip()]
    unknown = [x for x in args.paths if x not in PATHS]
    if unknown or not args.paths:
        p.error(f"--paths: unknown {unknown or 'empty'}; choose from {', '.join(PATHS)}")
    if args.micro_batch_size < 1:
        p.error(f"--micro-batch-size: need >= 1, got {args.micro_batch_size}")
    if not 1 <= args.prompt_min <= args.prompt_max:
        p.error(f"--prompt-min/--prompt-max: need 1 <= min <= max, got {args.prompt_min}/{args.prompt_max}")
    if not 0 <= args.common_prefix < args.prompt_min:
        p.error(f"--common-prefix: need 0 <= N < --prompt-min, got {args.common_prefix}")
    return args


def make_episodes(args: argparse.Namespace) -> list[EpisodeTrajectory]:
    """``groups × group_size`` one-step episodes; the members of a group share their prompt, as GRPO's do (with
    ``--common-prefix N``: only its first N tokens, as memory writes share their instructions)."""
    rng = np.random.default_rng(args.seed)
    vocab = SMOLLM2_135M["vocab_size"]
    head = rng.integers(3, vocab, args.common_prefix).tolist()
    episodes = []
    for g in range(args.groups):
        prompt = rng.integers(3, vocab, int(rng.integers(args.prompt_min, args.prompt_max + 1))).tolist()
        for k in range(args.group_size):
            if args.common_prefix:
                tail = int(rng.integers(args.prompt_min, args.prompt_max + 1)) - args.common_prefix
                prompt = head + rng.integers(3, vocab, tail).tolist()
            n = int(rng.integers(1, args.response_max + 1))
            mask = (rng.random(n) > 0.1).astype(int).tolist()  # ~10 % tool-output tokens (mask 0)
            step = StepTrajectory(
                step_id=f"g{g}e{k}/t0",
                prompt_ids=prompt,
                response_ids=rng.integers(3, vocab, n).tolist(),
                response_mask=mask,
                logprobs=(-rng.random(n) * np.array(mask)).tolist(),
                turn_id="t0",
                turn_role=TurnRole.TARGET,
            )
            episodes.append(
                EpisodeTrajectory(
                    episode_id=f"g{g}e{k}",
                    group_id=f"g{g}",
                    steps=(step,),
                    reward=float(rng.integers(0, 2)),
                    status=EpisodeStatus.COMPLETED,
                )
            )
    return episodes


def _model(args: argparse.Namespace) -> torch.nn.Module:
    """Random-init Llama of SmolLM2-135M's shape (``--hidden`` scales width and heads) with the trainer's LoRA."""
    from transformers import LlamaForCausalLM

    from memrl.testing.models import tiny_llama_config
    from memrl.train.lora import attach_lora

    scale = args.hidden / SMOLLM2_135M["hidden_size"]
    heads = max(1, round(SMOLLM2_135M["num_attention_heads"] * scale))
    shape = {
        **SMOLLM2_135M,
        "hidden_size": args.hidden - args.hidden % heads,
        "intermediate_size": max(1, round(SMOLLM2_135M["intermediate_size"] * scale)),
        "num_hidden_layers": args.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": heads // 3 if heads % 3 == 0 else 1,  # SmolLM2: 3 query heads per KV head
    }
    torch.manual_seed(args.seed)
    config = tiny_llama_config(**shape, max_position_embeddings=args.prompt_max + args.response_max + 8)
    config._attn_implementation = "sdpa"
    return attach_lora(LlamaForCausalLM(config).float(), LoraConfig()).train()


@contextlib.contextmanager
def _saved_storages(into: dict[int, int], model: torch.nn.Module) -> Iterator[None]:
    """Record in ``into`` (address → bytes) each distinct storage autograd saves for backward in the block,
    the model's weights aside (they are there anyway)."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            into[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        yield


def _forward_backward(model: torch.nn.Module, micro: list[MicroBatch], checkpointed: bool = False):
    """One pass as the trainer's update runs it; returns (wall seconds, CPU seconds, summed response NLL, the most
    bytes autograd kept for one micro-batch's backward)."""
    model.zero_grad(set_to_none=True)
    checkpoint_prompts(model, 1 if checkpointed else None)
    t0, c0, total, peak = time.perf_counter(), time.process_time(), 0.0, 0
    for mb in micro:
        storages: dict[int, int] = {}
        with _saved_storages(storages, model):
            loss = -(token_logprobs(forward_logits(model, mb), mb.input_ids) * mb.loss_mask).sum()
        peak = max(peak, sum(storages.values()))
        loss.backward()
        total += float(loss.detach())
    return time.perf_counter() - t0, time.process_time() - c0, total, peak


def padded_reference(records: list[SeqRecord], max_rows: int) -> list[MicroBatch]:
    """What the trainer would forward without prefix sharing: ``max_rows`` consecutive whole sequences per
    micro-batch, right-padded."""
    return [collate(records[i : i + max_rows]) for i in range(0, len(records), max_rows)]


def _forwarded(micro: list[MicroBatch]) -> int:
    return sum(mb.num_tokens + (mb.prefix_ids.numel() if mb.prefix_ids is not None else 0) for mb in micro)


@BENCHES.register("batch")
def bench_batch(argv: list[str]) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads or auto_threads())
    batch: PackedBatch = TrajectoryBatchBuilder().build(make_episodes(args))
    records = seq_records(batch, torch.zeros(batch.num_steps), torch.ones(batch.num_steps))
    layouts = {
        "shared_prefix": lambda: split_micro_batches(records, args.micro_batch_size),
        "padded": lambda: padded_reference(records, args.micro_batch_size),
        "per_row": lambda: [collate_shared([r]) for r in records],
        "checkpointed": lambda: split_micro_batches(records, args.micro_batch_size),
    }
    micro = {path: layouts[path]() for path in args.paths}
    model = _model(args)
    for path, mbs in micro.items():  # warm-up: one micro-batch each
        _forward_backward(model, mbs[:1], path == "checkpointed")
    times: dict[str, list[float]] = {path: [] for path in micro}
    cpu: dict[str, list[float]] = {path: [] for path in micro}
    losses: dict[str, float] = {}
    saved: dict[str, int] = {}
    for _ in range(args.repeats):
        for path, mbs in micro.items():
            wall, cpu_s, losses[path], saved[path] = _forward_backward(model, mbs, path == "checkpointed")
            times[path].append(wall)
            cpu[path].append(cpu_s)
    best = {path: min(v) for path, v in times.items()}
    best_cpu = {path: min(v) for path, v in cpu.items()}
    real = int((batch.prompt_lengths + batch.response_lengths).sum())
    base = "padded" if "padded" in micro else args.paths[0]
    ref = losses[base]
    return {
        "speedup_base": base,
        "speedup": {path: best[base] / t for path, t in best.items()},
        "cpu_speedup": {path: best_cpu[base] / t for path, t in best_cpu.items()},
        "tokens_per_s": {path: real / t for path, t in best.items()},
        "loss_rel_diff": {path: abs(v - ref) / max(abs(ref), 1e-12) for path, v in losses.items()},
        "saved_mb": {path: b / 2**20 for path, b in saved.items()},
        "peak_rss_mb": peak_rss_mb(),
        "losses": losses,
        "real_tokens": real,
        "forwarded_tokens": {path: _forwarded(mbs) for path, mbs in micro.items()},
        "micro_batches": {path: len(mbs) for path, mbs in micro.items()},
        "num_sequences": batch.num_steps,
        "seconds": times,
        "cpu_seconds": cpu,
        "model": {"layers": args.layers, "hidden": args.hidden, "lora_r": LoraConfig().r},
        "torch_threads": torch.get_num_threads(),
    }
