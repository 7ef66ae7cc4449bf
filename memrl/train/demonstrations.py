"""Gold demonstrations: off-policy expert traces for the replay SFT term (``train.replay.demonstrations: gold``).

Strict exact match needs the ``<answer>…</answer>`` tag. An instruct model that never writes it (as SmolLM2-135M
does not) earns no strictly right episode, so GRPO cannot discover the tag and replay
SFT, which imitates a group's best *right* trajectory, has nothing to imitate. As in SFT-then-RL cold starts and
LUFFY (off-policy expert traces mixed into GRPO), a replayed group whose best episode is below
``train.replay.min_reward`` gets a demonstration instead: the exact prompt the policy saw at the target turn, then
``<answer>{gold}</answer>`` and the tokenizer's eos.

With ``train.replay.demonstrations: gold_program`` a question whose dataset holds a program printing its answer
(``StepMeta.gold_python``: the synthetic task's arithmetic) is demonstrated as a tool-using answer instead: the
call ``<python>{program}</python>``, the result the python tool gives for it (run through the same executor as a
rollout's calls, so truncation and neutralisation match) injected as `` <result>…</result>``, then the tagged
answer and eos. Each of the three parts is tokenized on its own, as the rollout engine appends a model segment
and an injected result, and the result's tokens have mask 0: the demonstration holds token for token what a
rollout that wrote this call and this answer holds (plus the eos that ends every demonstration). Questions
without a program get the gold answer.

A demonstration is an ordinary :class:`~memrl.types.EpisodeTrajectory` (one target step, ``response_mask`` 1 on
every token the model would write), so batching and the SFT loss treat it as any other row. Nothing sampled
it, so its model tokens' ``logprobs`` are NaN (no behaviour log-prob, as on rollback-spliced tokens) and its
``reward`` is 0.0 (it is not scored): only the SFT term reads it, never RFT or a policy-gradient ratio.
Demonstrations are derived when a replay sample is drawn, never stored, so a resumed buffer rebuilds the same ones.

    >>> demo = GoldDemonstrations(tokenizer, min_reward=1.0)(group)   # None if the group needs none
"""

from __future__ import annotations

import dataclasses
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from memrl.formats import format_answer, format_result, format_tool_call
from memrl.tools.base import ToolCall, ToolResult
from memrl.types import (
    BranchFinish,
    EpisodeStatus,
    EpisodeTrajectory,
    StepMeta,
    StepTrajectory,
    ToolCallRecord,
    ToolStatus,
    TurnRole,
)

DEMO_SUFFIX = "#gold"  # a demonstration's episode id: the source episode's id + this
PROGRAM_TOOL = "python"  # the tool a gold program is a call of

# Runs one program as a rollout's python call runs (the tool, then the executor's truncation and neutralisation).
RunProgram = Callable[[str], ToolResult]


class ProgramRunner:
    """Runs gold programs through a :class:`~memrl.tools.ToolExecutor` of its own (so demonstrations do not count
    in the rollout's ``tools/python/*`` metrics), each distinct program once (a replayed group is demonstrated
    again every time it is drawn)."""

    def __init__(self, tools_cfg: Any, max_items: int = 4096) -> None:
        self.tools_cfg = dataclasses.replace(tools_cfg, enabled=[PROGRAM_TOOL])
        self.max_items = max_items
        self._executor: Any = None
        self._cache: OrderedDict[str, ToolResult] = OrderedDict()

    def __call__(self, program: str) -> ToolResult:
        if program in self._cache:
            self._cache.move_to_end(program)
            return self._cache[program]
        if self._executor is None:
            from memrl.tools.executor import ToolExecutor

            self._executor = ToolExecutor(self.tools_cfg)
        call = ToolCall(name=PROGRAM_TOOL, arguments=program, raw=format_tool_call(PROGRAM_TOOL, program))
        result = self._executor.execute([(call, None)])[0]
        self._cache[program] = result
        while len(self._cache) > self.max_items:
            self._cache.popitem(last=False)
        return result

    def close(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None


def _target_step(episode: EpisodeTrajectory) -> StepTrajectory | None:
    targets = [s for s in episode.steps if s.turn_role is TurnRole.TARGET]
    return targets[-1] if targets else None


def gold_demonstration(
    episode: EpisodeTrajectory, target: StepTrajectory, answer_ids: Sequence[int]
) -> EpisodeTrajectory:
    """The demonstration that answers ``target``'s prompt with ``answer_ids`` (the tagged gold answer + eos)."""
    gold = target.meta.gold_answer
    source = episode.source_episode_id
    n = len(answer_ids)
    step = StepTrajectory(
        step_id=f"{source}/gold",
        prompt_ids=target.prompt_ids,
        response_ids=tuple(answer_ids),
        response_mask=(1,) * n,
        logprobs=(math.nan,) * n,
        turn_id=target.turn_id,
        turn_role=TurnRole.TARGET,
        meta=StepMeta(
            turn_id=target.turn_id,
            turn_role=TurnRole.TARGET,
            finish=BranchFinish.ANSWER,
            source_episode_id=source,
            response_text=format_answer(gold or ""),
            gold_answer=gold,
            gold_python=target.meta.gold_python,
        ),
    )
    return EpisodeTrajectory(
        episode_id=source + DEMO_SUFFIX,
        group_id=episode.group_id,
        steps=(step,),
        reward=0.0,
        status=EpisodeStatus.COMPLETED,
        sample_index=episode.sample_index,
    )


def program_demonstration(
    episode: EpisodeTrajectory, target: StepTrajectory, parts: Sequence[Sequence[int]], result: ToolResult
) -> EpisodeTrajectory:
    """The demonstration that answers ``target``'s prompt with a call, its injected result and the answer:
    ``parts`` = (call ids, result ids, answer ids + eos); the result's tokens get mask 0, as a rollout's."""
    call, injected, answer = (tuple(p) for p in parts)
    demo = gold_demonstration(episode, target, (*call, *injected, *answer))
    program = target.meta.gold_python or ""
    record = ToolCallRecord(
        name=PROGRAM_TOOL,
        arguments=program,
        result=result.text,
        status=result.status,
        position=len(call),
        error=result.error,
    )
    text = (
        format_tool_call(PROGRAM_TOOL, program)
        + format_result(result.text)
        + format_answer(target.meta.gold_answer or "")
    )
    step = demo.steps[0]
    step = dataclasses.replace(
        step,
        response_mask=(1,) * len(call) + (0,) * len(injected) + (1,) * len(answer),
        logprobs=(math.nan,) * len(call) + (0.0,) * len(injected) + (math.nan,) * len(answer),
        meta=dataclasses.replace(step.meta, tool_calls=(record,), response_text=text),
    )
    return dataclasses.replace(demo, steps=(step,))


class GoldDemonstrations:
    """Builds a group's demonstration with the policy's tokenizer (``tokenizer.eos_token_id`` must be set).
    ``run_program``: where given, questions with a gold program are demonstrated as a call of it (see the module
    docstring)."""

    def __init__(
        self, tokenizer: Any, min_reward: float, memory: bool = False, run_program: RunProgram | None = None
    ) -> None:
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError(
                "train.replay.demonstrations='gold' ends each demonstration with the tokenizer's eos token, "
                "but the policy's tokenizer has no eos_token_id; set one or use demonstrations='none'"
            )
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.min_reward = min_reward
        self.memory = memory
        self.run_program = run_program

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def program_parts(self, program: str, gold: str) -> tuple[list[int], list[int], list[int], ToolResult]:
        """(call ids, injected result ids, answer ids + eos, the tool's result) of a gold program, each part
        tokenized alone as the rollout engine appends it. A program whose result is not the gold answer is a
        dataset error, raised with both."""
        assert self.run_program is not None
        result = self.run_program(program)
        if result.status is not ToolStatus.OK or result.text.strip() != gold.strip():
            raise ValueError(
                f"gold program {program!r} gave {result.status.value} result {result.text[:200]!r}, not the gold "
                f"answer {gold!r}: the dataset's gold_python must print exactly its answer"
            )
        call = self._encode(format_tool_call(PROGRAM_TOOL, program))
        return call, self._encode(format_result(result.text)), self.answer_ids(gold), result

    def answer_ids(self, gold: str) -> list[int]:
        """``<answer>{gold}</answer>`` as the policy would write it, then eos (which ends its turn)."""
        ids = self.tokenizer(format_answer(gold), add_special_tokens=False)["input_ids"]
        return [*ids, self.eos_id]

    def __call__(self, group: Sequence[EpisodeTrajectory]) -> EpisodeTrajectory | None:
        """The demonstration for one group (episodes sharing a ``group_id``): the gold answer when no episode
        reaches ``min_reward`` (else the best is its own SFT target) and the group has a gold answer, plus (with
        ``memory``) the gold operations of every memory write that got them wrong; ``None`` if neither."""
        if not group:
            return None
        demo = None
        best = max(group, key=lambda ep: ep.reward)  # the prompt SFT would have imitated (first of ties)
        target = _target_step(best)
        if best.reward < self.min_reward and target is not None and target.meta.gold_answer is not None:
            gold, program = target.meta.gold_answer, target.meta.gold_python
            if program is not None and self.run_program is not None:
                *parts, result = self.program_parts(program, gold)
                demo = program_demonstration(best, target, parts, result)
            else:
                demo = gold_demonstration(best, target, self.answer_ids(gold))
        writes = self._memory_demos(group) if self.memory else []
        if not writes:
            return demo
        if demo is None:
            return EpisodeTrajectory(
                episode_id=best.source_episode_id + DEMO_SUFFIX,
                group_id=best.group_id,
                steps=tuple(writes),
                reward=0.0,
                status=EpisodeStatus.COMPLETED,
                sample_index=best.sample_index,
                step_rewards_ext=(0.0,) * len(writes),
            )
        return dataclasses.replace(
            demo,
            steps=(*writes, *demo.steps),
            step_rewards_ext=(0.0,) * len(writes) + (None,) * len(demo.steps),
        )

    def _memory_demos(self, group: Sequence[EpisodeTrajectory]) -> list[StepTrajectory]:
        """One demonstration per applied memory write whose operations were not the gold ones: the write's
        prompt, then the gold operations and eos (:mod:`memrl.memory.gold`)."""
        out, seen = [], set()
        for ep in group:
            for step in ep.steps:
                write = step.meta.write
                if write is None or not write.applied or step.step_id in seen:
                    continue
                if write.gold_ops is None or write.op_right is not False:
                    continue
                seen.add(step.step_id)
                ids = self.tokenizer(write.gold_ops, add_special_tokens=False)["input_ids"]
                ids = [*ids, self.eos_id]
                meta = dataclasses.replace(
                    step.meta,
                    response_text=write.gold_ops,
                    credit_group=f"{ep.group_id}/memory/gold",
                    write=dataclasses.replace(write, format_errors=(), op_score=1.0, snapshot_reward=None),
                )
                out.append(
                    dataclasses.replace(
                        step,
                        step_id=f"{step.step_id}/gold",
                        response_ids=tuple(ids),
                        response_mask=(1,) * len(ids),
                        logprobs=(math.nan,) * len(ids),
                        meta=meta,
                    )
                )
        return out
