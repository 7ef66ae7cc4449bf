"""Imitation warm start of the memory writer: supervised steps on gold memory writes before reinforcement learning.

The untrained policy follows the memory-operation format in almost no write, so the RL
signal of its writes is mostly the format term, and the gold operations that the replay SFT term adds reach the
writer a few rows per update. As in SFT-then-RL cold starts (DeepSeek-R1) and Memory-R1's recipe, the warm start
first imitates the writes a perfect writer makes on training episodes whose turns carry gold operations
(:mod:`memrl.memory.gold`; the synthetic task knows them for every turn):

1. *Teacher-forced ingest.* Each episode's history is written chunk by chunk (``episode.ingest_chunk_turns``)
   exactly as the runner writes it: the same neighbours, the same prompt, but the reply is the gold operations
   (:meth:`~memrl.memory.manager.MemorySystem.write_batch` with a ``teacher``), which are then applied, so every
   later write reads the store a right writer would have built.
2. *SFT.* ``-mean log p(gold reply | prompt)`` per sequence, averaged over ``batch_size`` writes per optimizer
   step, for ``epochs`` passes, with the training run's optimizer (its learning rate and clipping). With
   ``balance_ops`` each write is weighted by ``1/sqrt`` of its decision's count (:func:`op_weights`).

A dataset without gold operations (LoCoMo, LongMemEval) has nothing to imitate: the warm start refuses it, and the
writer learns from its credit alone (outcome-only).

``train.warm_start.role: answer`` imitates target-turn answers instead (:mod:`memrl.train.warm_start_answer`, which
builds on this module's SFT steps, run on the answer role's adapter).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from peft import set_peft_model_state_dict
from tqdm import tqdm

from memrl.memory.gold import gold_text
from memrl.memory.manager import MemorySystem
from memrl.memory.writer import chunk_end
from memrl.threads import follow_threads
from memrl.train.lora import adapter_for, adapter_state, trainable_parameters, use_adapter
from memrl.train.losses import LOSS_AGGREGATIONS
from memrl.train.microbatch import SeqRecord, collate_common, forward_logits, model_device, token_logprobs
from memrl.types import BatchInput

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Demonstration:
    """One gold reply: the prompt the policy read and the gold reply's ids (eos included)."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    episode_id: str
    decision: str = ""  # the gold operations' kinds, e.g. "UPDATE" or "ADD+NOOP" for a chunk
    weight: float = 1.0  # its weight in the SFT loss
    # 1 on the reply tokens the policy writes, 0 on injected ones (a tool's result); None: every token is written
    response_mask: tuple[int, ...] | None = None


def _teacher(req) -> str:
    text = gold_text(req.turns, req.neighbours)
    if text is None:
        ids = ", ".join(t.turn_id for t in req.turns if not t.metadata.get("memory_op"))
        raise ValueError(
            f"train.warm_start imitates gold memory writes, but turn(s) {ids} carry no gold operation "
            "(metadata 'memory_op'); use a dataset that knows them (the synthetic task) or "
            "train.warm_start.episodes=0 (outcome-only credit)"
        )
    return text


def gold_writes(memory: MemorySystem, inputs: Sequence[BatchInput], chunk: int) -> list[Demonstration]:
    """The gold writes of ``inputs``' histories, written batch-wise (one write per episode per call) into
    scratch namespaces of ``memory`` that are released afterwards."""
    managers = [memory.manager(f"warm-start/{bi.episode_id}") for bi in inputs]
    out: list[Demonstration] = []
    try:
        cursor = 0
        while True:
            items, owners = [], []
            for bi, mgr in zip(inputs, managers, strict=True):
                stop = chunk_end(len(bi.history), cursor, chunk)
                if stop > cursor:
                    items.append((mgr, bi.history[cursor:stop]))
                    owners.append(bi)
            if not items:
                return out
            for bi, res in zip(owners, memory.write_batch(items, teacher=_teacher), strict=True):
                decision = "+".join(sorted({op.op.value for op in res.ops})) or "NOOP"
                out.append(
                    Demonstration(res.prompt_ids, res.samples[0].response_ids, bi.episode_id, decision)
                )
            cursor = max(chunk_end(len(bi.history), cursor, chunk) for bi in owners)
    finally:
        for mgr in managers:
            memory.release(mgr.episode_id)


def op_weights(demos: Sequence[Demonstration]) -> list[Demonstration]:
    """``demos`` weighted by ``1/sqrt(count of their decision)``, normalised to mean 1: the rare decision (UPDATE)
    weighs more than a common one, but less than full inverse frequency would give it, which would trade ADD
    recall for it."""
    counts = Counter(d.decision for d in demos)
    raw = [counts[d.decision] ** -0.5 for d in demos]
    scale = len(raw) / sum(raw) if raw else 1.0
    return [dataclasses.replace(d, weight=w * scale) for d, w in zip(demos, raw, strict=True)]


def _records(demos: Sequence[Demonstration], adapter: str) -> list[SeqRecord]:
    out = []
    for i, d in enumerate(demos):
        zeros = torch.zeros(len(d.prompt_ids))
        mask = torch.ones(len(d.response_ids))
        if d.response_mask is not None:
            mask = torch.tensor(d.response_mask, dtype=torch.float32)
        out.append(
            SeqRecord(
                ids=torch.tensor([*d.prompt_ids, *d.response_ids], dtype=torch.long),
                prompt_len=len(d.prompt_ids),
                loss_mask=torch.cat([zeros, mask]),
                old_logp=torch.zeros(len(d.prompt_ids) + len(d.response_ids)),
                adv=torch.cat([zeros, mask * d.weight]),  # the SFT coefficient rides in the advantage slot
                index=i,
                adapter=adapter,
            )
        )
    return out


def sft_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, demos: Sequence[Demonstration],
    micro_batch_size: int, max_grad_norm: float, loss_agg: str = "seq-mean-token-mean", role: str = "memory",
) -> float:  # fmt: skip
    """One optimizer step of ``-mean over demos of (mean token log p(reply | prompt))`` (``loss_agg``
    ``token-mean``: ``-mean over every reply token of the step``) on ``role``'s adapter; returns that loss.
    Injected reply tokens (mask 0) are read, never trained."""
    agg = LOSS_AGGREGATIONS.get(loss_agg)
    adapter = adapter_for(model, role)
    records = _records(demos, adapter)
    per_token = loss_agg == "token-mean"
    total = float(sum(float(r.loss_mask.sum()) for r in records) if per_token else len(records))
    loss = 0.0
    model.train()
    device = model_device(model)
    for i in range(0, len(records), micro_batch_size):
        # Every write's prompt starts with the same instructions: forwarded once per micro-batch.
        mb = collate_common(records[i : i + micro_batch_size]).to(device)
        with use_adapter(model, adapter):
            logp = token_logprobs(forward_logits(model, mb), mb.input_ids)
            part = (-mb.adv * logp * agg.weights(mb.loss_mask, mb.seq_index)).sum() / total
            part.backward()
        loss += float(part.detach())
    torch.nn.utils.clip_grad_norm_(trainable_parameters(model), max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return loss


@contextlib.contextmanager
def learning_rate(optimizer: torch.optim.Optimizer, lr: float | None):
    """``optimizer`` at ``lr`` inside the block (None: as it is), its own learning rates after."""
    own = [group["lr"] for group in optimizer.param_groups]
    if lr is not None:
        for group in optimizer.param_groups:
            group["lr"] = lr
    try:
        yield
    finally:
        for group, value in zip(optimizer.param_groups, own, strict=True):
            group["lr"] = value


def sft_pass(
    res, demos: Sequence[Demonstration], rng: random.Random, desc: str, progress: bool
) -> list[float]:
    """One shuffled pass of SFT steps of ``train.warm_start.batch_size`` writes over ``demos``; their losses."""
    cfg, wc = res.cfg, res.cfg.train.warm_start
    order = list(demos)
    rng.shuffle(order)
    losses: list[float] = []
    with (
        learning_rate(res.updater.optimizer, wc.lr),
        tqdm(
            total=-(-len(order) // wc.batch_size),
            desc=desc,
            unit="step",
            file=sys.stderr,
            disable=not progress,
        ) as bar,
    ):
        for i in range(0, len(order), wc.batch_size):
            follow_threads(f"warm-start SFT step {i // wc.batch_size + 1}")
            losses.append(
                sft_step(
                    res.model, res.updater.optimizer, order[i : i + wc.batch_size],
                    cfg.train.micro_batch_size, cfg.train.max_grad_norm, wc.loss_agg, wc.role,
                )
            )  # fmt: skip
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
            bar.update(1)
    return losses


def warm_start(res, progress: bool = False) -> dict[str, float]:
    """Run ``train.warm_start`` on ``res`` (:class:`~memrl.train.setup.TrainResources`): gold writes of the first
    ``episodes`` training episodes, then ``epochs`` shuffled passes of SFT, then the check (:func:`check_and_rebalance`)
    on the next ``check_episodes``; returns ``warm_start/*`` metrics."""
    cfg, wc = res.cfg, res.cfg.train.warm_start
    t0 = time.perf_counter()
    from memrl.train.setup import load_split

    # The head of the training split (as loaded, before the data source shuffles): the data source's position
    # is untouched, so a resumed run draws exactly what an uninterrupted one would.
    loaded = load_split(cfg.data, cfg.data.split, wc.episodes + wc.check_episodes)
    inputs, held = loaded[: wc.episodes], loaded[wc.episodes :]
    demos = gold_writes(res.runner.memory, inputs, cfg.episode.ingest_chunk_turns)
    if wc.balance_ops:
        demos = op_weights(demos)
    t_ingest = time.perf_counter() - t0
    rng = random.Random(cfg.seed)
    losses: list[float] = []
    for _ in range(wc.epochs):
        losses += sft_pass(res, demos, rng, "warm start", progress)
    tail = losses[-max(1, len(losses) // 10) :]
    metrics = {
        "warm_start/demonstrations": float(len(demos)),
        "warm_start/steps": float(len(losses)),
        "warm_start/loss_first": losses[0] if losses else 0.0,
        "warm_start/loss_last": sum(tail) / len(tail) if tail else 0.0,
        "warm_start/reply_tokens": float(sum(len(d.response_ids) for d in demos)),
        "time/warm_start_ingest_s": t_ingest,
    }
    if held:
        metrics.update(check_and_rebalance(res, demos, held, rng, progress))
    metrics["time/warm_start_s"] = time.perf_counter() - t0
    logger.info(
        "warm start: %d gold writes of %d episodes, %d SFT steps, loss %.3f -> %.3f (%.0f s)",
        len(demos), len(inputs), len(losses), metrics["warm_start/loss_first"], metrics["warm_start/loss_last"],
        metrics["time/warm_start_s"],
    )  # fmt: skip
    return metrics


# A failed check's balanced passes, each taken from the RL phase's budget.
BALANCED_PASSES = 2
CHECKED_DECISIONS = ("ADD", "UPDATE", "NOOP")


def balanced(demos: Sequence[Demonstration], rng: random.Random, floor: int = 1) -> list[Demonstration]:
    """As many writes of each decision as the rarest decision with at least ``floor`` writes has (a decision
    with fewer gives all of its own), unweighted: one class-balanced pass, as in re-balancing a classifier after
    its representation is learned."""
    by: dict[str, list[Demonstration]] = {}
    for d in demos:
        by.setdefault(d.decision, []).append(d)
    n = min((len(v) for v in by.values() if len(v) >= floor), default=0)
    return [dataclasses.replace(d, weight=1.0) for v in by.values() for d in rng.sample(v, min(n, len(v)))]


def check_writer(res, episodes: Sequence[BatchInput], progress: bool = False) -> dict:
    """The current writer's greedy writes of ``episodes``, scored against their gold operations
    (:func:`~memrl.memory.write_scores.score_writes`; needs a dataset that knows them)."""
    from memrl.memory.write_scores import score_writes
    from memrl.train.setup import publish_adapter

    publish_adapter(res, 0)  # generate with the weights the SFT steps left
    return score_writes(
        res.runner.memory, episodes, chunk=res.cfg.episode.ingest_chunk_turns,
        desc="warm-start check" if progress else "",
    )  # fmt: skip


def lowest_recall(scores: dict) -> float:
    """The lowest recall among the decisions the check's episodes call for (ADD / UPDATE / NOOP)."""
    recalls = [scores["recall"].get(op) for op in CHECKED_DECISIONS]
    return min((r for r in recalls if r is not None), default=1.0)


def check_and_rebalance(
    res,
    demos: Sequence[Demonstration],
    held: Sequence[BatchInput],
    rng: random.Random,
    progress: bool = False,
) -> dict[str, float]:
    """Check the warm-started writer on ``held`` (training episodes it did not imitate). While a decision's recall
    is under ``train.warm_start.min_recall``, run a class-balanced pass (:func:`balanced`) and check again, at
    most :data:`BALANCED_PASSES` times; keep the checked weights with the best lowest recall."""
    wc = res.cfg.train.warm_start
    t0 = time.perf_counter()
    scores = check_writer(res, held, progress)
    adapter = adapter_for(res.model, "memory")  # the only adapter the warm start trains
    best = (lowest_recall(scores), adapter_state(res.model, adapter), scores)
    passes = 0
    while best[0] < wc.min_recall and passes < BALANCED_PASSES:
        passes += 1
        logger.warning(
            "warm start: lowest decision recall %.2f on %d held-out training episodes (recall %s), under "
            "train.warm_start.min_recall=%.2f: class-balanced pass %d of %d",
            best[0], len(held), scores["recall"], wc.min_recall, passes, BALANCED_PASSES,
        )  # fmt: skip
        sft_pass(res, balanced(demos, rng, wc.batch_size), rng, f"balanced pass {passes}", progress)
        scores = check_writer(res, held, progress)
        if lowest_recall(scores) > best[0]:
            best = (lowest_recall(scores), adapter_state(res.model, adapter), scores)
    if best[2] is not scores:  # the last pass made it worse: back to the best checked weights
        set_peft_model_state_dict(res.model, best[1], adapter_name=adapter)
        from memrl.train.setup import publish_adapter

        publish_adapter(res, 0)
    kept = best[2]
    out = {
        f"warm_start/check_recall_{op}": kept["recall"][op]
        for op in CHECKED_DECISIONS
        if kept["recall"][op] is not None
    }
    out.update({
        "warm_start/check_lowest_recall": best[0],
        "warm_start/check_update_right_target": kept["update_recall_right_target"] or 0.0,
        "warm_start/check_end_state_correct": kept["end_state"]["correct"] or 0.0,
        "warm_start/check_malformed_rate": kept["malformed_rate"] or 0.0,
        "warm_start/balanced_passes": float(passes),
        "time/warm_start_check_s": time.perf_counter() - t0,
    })  # fmt: skip
    return out
