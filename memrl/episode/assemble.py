"""Turn a finished :class:`EpisodeState` into ``EpisodeTrajectory`` objects (one per leaf).

Leaf 0 carries the episode's memory steps before its target step:

* policy writes (``memory.extractor: policy``): one trainable step per write, one per alternative at snapshot
  writes (:func:`memory_steps`); ``step_rewards_ext`` holds each write's credit (:mod:`memrl.episode.credit`),
  which the batch builder trains on in the write's own GRPO group;
* with ``episode.record_history_turns``, one untrainable step per history turn carrying its memory ops; its
  ``step_rewards_ext`` says whether a fact it wrote reached the answer's prompt (the episode's mean leaf reward
  if so, 0 if not, ``None`` when it wrote nothing), for inspection: no loss reads it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from memrl.episode.config import EpisodeConfig
from memrl.episode.credit import CreditInput, credit_group, step_rewards, write_of
from memrl.episode.state import EpisodeState
from memrl.types import (
    BranchFinish,
    EpisodeStatus,
    EpisodeTrajectory,
    MemoryOpType,
    MemoryWrite,
    StepMeta,
    StepRole,
    StepTrajectory,
    TurnRole,
)


def history_step_prompt(tokenizer: Any, speaker: str, text: str) -> list[int]:
    """Token ids a history step records as its prompt: what the memory agent read (``speaker: text``)."""
    ids = tokenizer(f"{speaker}: {text}" if speaker else text, add_special_tokens=False)["input_ids"]
    return list(ids) or [0]


def history_turn_steps(st: EpisodeState, tokenizer: Any) -> list[StepTrajectory]:
    """One untrainable step per history turn carrying that turn's memory ops (and the summary op on the last)."""
    out = []
    turns = st.inp.history
    for i, turn in enumerate(turns):
        ops = list(st.history_ops.get(turn.turn_id, []))
        if i == len(turns) - 1:
            ops += st.summary_ops
        out.append(
            StepTrajectory(
                step_id=f"{st.episode_id}/h{i}",
                prompt_ids=tuple(history_step_prompt(tokenizer, turn.speaker, turn.text)),
                response_ids=(),
                response_mask=(),
                logprobs=(),
                turn_id=turn.turn_id,
                turn_role=TurnRole.HISTORY,
                meta=StepMeta(
                    turn_id=turn.turn_id,
                    turn_role=TurnRole.HISTORY,
                    memory_ops=tuple(ops),
                    source_episode_id=st.episode_id,
                    # the turn as read, for inspectors (memrl inspect) that have no tokenizer at hand
                    extra={"speaker": turn.speaker, "text": turn.text, "timestamp": turn.timestamp},
                ),
            )
        )
    return out


def memory_steps(st: EpisodeState) -> list[StepTrajectory]:
    """One trainable step per policy write (``memory.extractor: policy``), one per alternative at snapshot
    writes: prompt = what the writer read, response = its operations (mask 1), rollout log-probs."""
    from memrl.memory.faithfulness import turn_kind, unsupported_facts
    from memrl.memory.gold import gold_text, ops_score
    from memrl.memory.writer import turn_line

    out, turns_read = [], 0
    for i, res in enumerate(st.writes):
        turns_read += len(res.turns)
        rewards = st.snapshot_rewards.get(i, [])
        gold = gold_text(res.turns, res.neighbours)
        k = len(res.samples)
        kinds = tuple(turn_kind(t) for t in res.turns)
        for j, sample in enumerate(res.samples):
            facts = [d.text for d in sample.ops.decisions if d.op in (MemoryOpType.ADD, MemoryOpType.UPDATE)]
            write = MemoryWrite(
                index=i,
                alternative=j,
                alternatives=k,
                applied=j == 0,
                turns_read=turns_read,
                facts_before=len(res.facts_before),
                facts_after=len(res.facts_after) if j == 0 else None,
                format_errors=tuple(sample.ops.errors),
                op_score=ops_score(res.turns, res.neighbours, sample.ops.decisions),
                gold_ops=gold,
                snapshot_reward=rewards[j] if j < len(rewards) else None,
                turn_kinds=kinds,
                facts_written=len(facts),
                unsupported_facts=unsupported_facts(facts, res.turns),
            )
            extra = {  # what the writer read and decided, for inspectors (memrl inspect)
                "read_turns": [turn_line(t) for t in res.turns],
                "read_facts": [
                    f"{n}. [{f.timestamp or 'undated'}] {f.text}" for n, f in enumerate(res.neighbours)
                ],
                "decisions": [_describe(d) for d in sample.ops.decisions],
            }
            if sample.resolved is not None:  # what the store changed (memrl.memory.write_target)
                extra["resolved"] = [d.extra["resolved"] for d in sample.resolved if "resolved" in d.extra]
            n = len(sample.response_ids)
            out.append(
                StepTrajectory(
                    step_id=f"{st.episode_id}/w{i}" + (f".{j}" if k > 1 else ""),
                    prompt_ids=res.prompt_ids,
                    response_ids=sample.response_ids,
                    response_mask=(1,) * n,
                    logprobs=sample.logprobs,
                    turn_id=res.turns[-1].turn_id,
                    turn_role=TurnRole.HISTORY,
                    meta=StepMeta(
                        turn_id=res.turns[-1].turn_id,
                        turn_role=TurnRole.HISTORY,
                        memory_ops=res.ops if j == 0 else (),
                        source_episode_id=st.episode_id,
                        response_text=sample.text,
                        role=StepRole.MEMORY,
                        write=write,
                        extra=extra,
                    ),
                )
            )
    return out


def _describe(d) -> str:
    if d.op is MemoryOpType.NOOP:
        return f"NOOP ({d.reason})" if d.reason else "NOOP"
    fid = "" if d.fact_id is None else f" fact {d.fact_id}"
    return f"{d.op.value}{fid} {d.text}".rstrip()


def _with_credit(
    st: EpisodeState, cfg: EpisodeConfig, steps: list[StepTrajectory]
) -> tuple[list[StepTrajectory], list[float | None]]:
    """Memory steps with their GRPO group (``StepMeta.credit_group``), and their credits (:mod:`memrl.episode.credit`)."""
    if not steps:
        return [], []
    used = frozenset(st.prompt.included_fact_ids) if st.prompt is not None else frozenset()
    outcome = sum(st.rewards) / len(st.rewards) if st.rewards else 0.0
    rewards = step_rewards(CreditInput(tuple(steps), outcome, used), cfg.memory_credit)
    out = []
    for step in steps:
        group = credit_group(st.inp.group_id, write_of(step))
        out.append(dataclasses.replace(step, meta=dataclasses.replace(step.meta, credit_group=group)))
    return out, rewards


def _target_meta(st: EpisodeState, leaf: StepTrajectory, leaf_index: int, response: str) -> StepTrajectory:
    """Attach the episode's prompt/memory facts to a leaf's StepMeta (the rollout filled tree/tool fields)."""
    ops = list(st.retrieve_ops) + (list(st.update_ops) if leaf_index == 0 else [])
    prompt = st.prompt
    extra = {
        **leaf.meta.extra,
        "prompt_tokens": len(leaf.prompt_ids),
        "summary_cut": bool(prompt.summary_cut),
        **st.metrics,  # recent_history: turns / tokens of the history the prompt carries vs the whole
    }
    meta = dataclasses.replace(
        leaf.meta,
        turn_id=st.inp.target.turn_id,
        memory_ops=tuple(leaf.meta.memory_ops) + tuple(ops),
        retrieved_ids=tuple(f.fact_id for f in st.retrieved),
        included_fact_ids=tuple(prompt.included_fact_ids),
        cut_fact_ids=tuple(prompt.cut_fact_ids),
        leaf_index=leaf_index,
        source_episode_id=st.episode_id,
        response_text=response,
        gold_answer=st.inp.target_answer,
        gold_python=st.inp.metadata.get("gold_python"),
        extra=extra,
    )
    return dataclasses.replace(leaf, meta=meta, step_id=f"{st.episode_id}/t{leaf_index}")


def _inspection_extra(st: EpisodeState, step: StepTrajectory, tokenizer: Any) -> StepTrajectory:
    """What ``memrl inspect`` needs beyond the training fields: the question, gold evidence, and the
    response decoded in spans (cut at mask changes and tree nodes; see :mod:`memrl.inspect.spans`)."""
    from memrl.inspect.spans import decode_spans

    meta = st.inp.metadata
    cuts = [node.pos for node in step.meta.tree_path]
    extra = {
        **step.meta.extra,
        "question": st.inp.final_query,
        "gold_evidence": list(meta.get("evidence_turn_ids", ())),
        "category": str(meta.get("category", meta.get("question_type", ""))),
        "response_spans": decode_spans(tokenizer, step.response_ids, step.response_mask, cuts),
    }
    return dataclasses.replace(step, meta=dataclasses.replace(step.meta, extra=extra))


def _memory_credit(st: EpisodeState, hist: list[StepTrajectory]) -> list[float | None]:
    used = set(st.prompt.included_fact_ids) if st.prompt is not None else set()
    mean_reward = sum(st.rewards) / len(st.rewards) if st.rewards else 0.0
    out: list[float | None] = []
    for step in hist:
        written = {
            fid
            for op in step.meta.memory_ops
            if op.op in (MemoryOpType.ADD, MemoryOpType.UPDATE)
            for fid in op.fact_ids
        }
        out.append(None if not written else (mean_reward if written & used else 0.0))
    return out


def assemble_episode(st: EpisodeState, cfg: EpisodeConfig, tokenizer: Any) -> list[EpisodeTrajectory]:
    inp = st.inp
    if st.status is EpisodeStatus.FAILED or not st.leaves:
        return [
            EpisodeTrajectory(
                episode_id=inp.episode_id,
                group_id=inp.group_id,
                steps=(),
                reward=0.0,
                status=EpisodeStatus.FAILED,
                sample_index=inp.sample_index,
                failure_reason=st.failure_reason or "no leaves were generated",
            )
        ]
    hist = history_turn_steps(st, tokenizer) if cfg.record_history_turns else []
    credit = _memory_credit(st, hist)
    writes, write_credit = _with_credit(st, cfg, memory_steps(st))
    hist, credit = writes + hist, write_credit + credit
    n = len(st.leaves)
    out = []
    for j, (leaf, resp, reward) in enumerate(zip(st.leaves, st.responses, st.rewards, strict=True)):
        target = _inspection_extra(st, _target_meta(st, leaf, j, resp), tokenizer)
        steps = (hist if j == 0 else []) + [target]
        ext = (credit if j == 0 else []) + [None]
        # Only running out of response budget truncates; answer / eos / tool or retry limits complete.
        truncated = leaf.meta.finish is BranchFinish.LENGTH
        status = EpisodeStatus.TRUNCATED if truncated else EpisodeStatus.COMPLETED
        out.append(
            EpisodeTrajectory(
                episode_id=inp.episode_id if n == 1 else f"{inp.episode_id}#{j}",
                group_id=inp.group_id,
                steps=tuple(steps),
                reward=float(reward),
                status=status,
                sample_index=inp.sample_index,
                metrics={
                    "episode/prompt_tokens": float(len(leaf.prompt_ids)),
                    "episode/response_tokens": float(len(leaf.response_ids)),
                    "episode/facts_retrieved": float(len(st.retrieved)),
                    "episode/facts_cut": float(len(st.prompt.cut_fact_ids)),
                    "episode/history_turns": float(len(inp.history)),
                    **{f"episode/{k}": v for k, v in st.metrics.items()},
                },
                step_rewards_ext=tuple(ext),
            )
        )
    return out
