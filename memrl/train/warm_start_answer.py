"""Imitation warm start of the answer role: SFT on gold answers (or gold programs) before reinforcement learning.

The replay SFT term demonstrates a group's gold answer only when the group found no right one, a few rows per
update: a policy that never calls the python tool meets a demonstrated call rarely, and the policy gradient of the groups with varied rewards (lookups, where answering at once wins)
outweighs it, so GRPO removed the call it was shown (docs/results.md, "Arithmetic over memory through the python
tool"). As in SFT-then-RL cold starts (DeepSeek-R1, ReTool), the answer role first imitates, on the first
``train.warm_start.episodes`` training episodes:

1. *Prompts.* Each episode's history is ingested and its target prompt built by the training runner
   (:meth:`~memrl.episode.runner.EpisodeRunner.target_prompts`): the very prompt a rollout of that episode answers,
   its memory included, but nothing is generated.
2. *Demonstrations,* tokenized as :class:`~memrl.train.demonstrations.GoldDemonstrations` tokenizes the replay's:
   with ``train.replay.demonstrations: gold_program`` a question whose dataset holds a program is demonstrated as
   the call, the tool's injected result (mask 0: read, never trained) and the tagged answer; any other question,
   or ``gold``, as the tagged gold answer.
3. *SFT* (:func:`~memrl.train.warm_start.sft_step` on the answer adapter), ``epochs`` shuffled passes of
   ``batch_size`` demonstrations per optimizer step.

An episode whose prompt cannot be built (over the prompt budget) is left out with a warning naming it; a batch in
which every prompt fails raises.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Sequence

from memrl.train.demonstrations import GoldDemonstrations, ProgramRunner
from memrl.train.warm_start import Demonstration, sft_pass
from memrl.types import BatchInput

logger = logging.getLogger(__name__)

PROMPT_BATCH = 32  # episodes ingested together (the runner batches their embeddings)


def answer_demonstrations(
    prompts: Sequence[tuple[int, ...]], inputs: Sequence[BatchInput], demonstrate: GoldDemonstrations
) -> list[Demonstration]:
    """The demonstration of each input's gold answer after its prompt: a program call where ``demonstrate`` runs
    programs and the input has one (``metadata["gold_python"]``), else the tagged answer."""
    out = []
    for prompt, bi in zip(prompts, inputs, strict=True):
        if bi.target_answer is None:
            raise ValueError(
                f"train.warm_start.role=answer imitates gold answers, but episode {bi.episode_id!r} has no "
                "target answer"
            )
        program = bi.metadata.get("gold_python")
        if program is not None and demonstrate.run_program is not None:
            call, injected, answer, _ = demonstrate.program_parts(program, bi.target_answer)
            ids = (*call, *injected, *answer)
            mask = (1,) * len(call) + (0,) * len(injected) + (1,) * len(answer)
            out.append(Demonstration(prompt, ids, bi.episode_id, "program", response_mask=mask))
        else:
            ids = tuple(demonstrate.answer_ids(bi.target_answer))
            out.append(Demonstration(prompt, ids, bi.episode_id, "answer"))
    return out


def target_prompts(runner, inputs: Sequence[BatchInput]) -> tuple[list[tuple[int, ...]], list[BatchInput]]:
    """The target prompts of ``inputs`` (in batches of :data:`PROMPT_BATCH`) and the inputs they belong to; an
    episode whose prompt failed is left out, with a warning naming it and why."""
    prompts, kept, failed = [], [], []
    for i in range(0, len(inputs), PROMPT_BATCH):
        chunk = inputs[i : i + PROMPT_BATCH]
        for bi, got in zip(chunk, runner.target_prompts(chunk), strict=True):
            if isinstance(got, str):
                failed.append(f"{bi.episode_id} ({got})")
            else:
                prompts.append(got)
                kept.append(bi)
    if failed:
        logger.warning(
            "answer warm start: %d of %d episodes left out, their prompt failed: %s",
            len(failed), len(inputs), "; ".join(failed[:5]),
        )  # fmt: skip
    if not kept:
        raise ValueError(f"train.warm_start.role=answer: every episode's prompt failed, e.g. {failed[0]}")
    return prompts, kept


def answer_warm_start(res, progress: bool = False) -> dict[str, float]:
    """Run ``train.warm_start`` with ``role: answer`` on ``res`` (:class:`~memrl.train.setup.TrainResources`);
    returns ``warm_start/*`` metrics (``warm_start/demos_<kind>``: demonstrations per kind, program or answer)."""
    cfg, wc = res.cfg, res.cfg.train.warm_start
    t0 = time.perf_counter()
    from memrl.train.setup import load_split

    # The head of the training split, as the writer's warm start takes it (the data source's position is untouched).
    inputs = load_split(cfg.data, cfg.data.split, wc.episodes)
    prompts, kept = target_prompts(res.runner, inputs)
    programs = cfg.train.replay.demonstrations == "gold_program"
    runner = ProgramRunner(cfg.tools) if programs else None
    try:
        demos = answer_demonstrations(
            prompts, kept, GoldDemonstrations(res.policy.tokenizer, 1.0, run_program=runner)
        )
    finally:
        if runner is not None:
            runner.close()
    t_prompts = time.perf_counter() - t0
    rng = random.Random(cfg.seed)
    losses: list[float] = []
    for epoch in range(wc.epochs):
        losses += sft_pass(res, demos, rng, f"answer warm start {epoch + 1}/{wc.epochs}", progress)
    tail = losses[-max(1, len(losses) // 10) :]
    kinds = Counter(d.decision for d in demos)
    metrics = {
        "warm_start/demonstrations": float(len(demos)),
        **{f"warm_start/demos_{kind}": float(n) for kind, n in sorted(kinds.items())},
        "warm_start/steps": float(len(losses)),
        "warm_start/loss_first": losses[0],
        "warm_start/loss_last": sum(tail) / len(tail),
        "warm_start/reply_tokens": float(
            sum(sum(d.response_mask or (1,) * len(d.response_ids)) for d in demos)
        ),
        "time/warm_start_ingest_s": t_prompts,
        "time/warm_start_s": time.perf_counter() - t0,
    }
    logger.info(
        "answer warm start: %d demonstrations (%s) of %d episodes, %d SFT steps, loss %.3f -> %.3f (%.0f s)",
        len(demos), dict(kinds), len(inputs), len(losses), metrics["warm_start/loss_first"],
        metrics["warm_start/loss_last"], metrics["time/warm_start_s"],
    )  # fmt: skip
    return metrics
