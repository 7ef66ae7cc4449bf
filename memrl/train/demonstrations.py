"""Gold demonstrations: off-policy expert traces for the replay SFT term (``train.replay.demonstrations: gold``).

Strict exact match needs the ``<answer>…</answer>`` tag. An instruct model that never writes it (SmolLM2-135M:
0 of 256 samples at temperature 1.0) earns no strictly right episode, so GRPO cannot discover the tag and replay
SFT, which imitates a group's best *right* trajectory, has nothing to imitate. As in SFT-then-RL cold starts and
LUFFY (off-policy expert traces mixed into GRPO), a replayed group whose best episode is below
``train.replay.min_reward`` gets a demonstration instead: the exact prompt the policy saw at the target turn, then
``<answer>{gold}</answer>`` and the tokenizer's eos.

A demonstration is an ordinary :class:`~memrl.types.EpisodeTrajectory` (one target step, ``response_mask`` 1 on
every answer token), so batching and the SFT loss treat it as any other row. Nothing sampled it, so its
``logprobs`` are NaN (no behaviour log-prob, as on rollback-spliced tokens) and its ``reward`` is 0.0 (it is not
scored): only the SFT term reads it, never RFT or a policy-gradient ratio. Demonstrations are derived when a
replay sample is drawn, never stored, so a resumed buffer rebuilds the same ones.

    >>> demo = GoldDemonstrations(tokenizer, min_reward=1.0)(group)   # None if the group needs none
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from memrl.formats import format_answer
from memrl.types import BranchFinish, EpisodeStatus, EpisodeTrajectory, StepMeta, StepTrajectory, TurnRole

DEMO_SUFFIX = "#gold"  # a demonstration's episode id: the source episode's id + this


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


class GoldDemonstrations:
    """Builds a group's demonstration with the policy's tokenizer (``tokenizer.eos_token_id`` must be set)."""

    def __init__(self, tokenizer: Any, min_reward: float) -> None:
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError(
                "train.replay.demonstrations='gold' ends each demonstration with the tokenizer's eos token, "
                "but the policy's tokenizer has no eos_token_id; set one or use demonstrations='none'"
            )
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        self.min_reward = min_reward

    def answer_ids(self, gold: str) -> list[int]:
        """``<answer>{gold}</answer>`` as the policy would write it, then eos (which ends its turn)."""
        ids = self.tokenizer(format_answer(gold), add_special_tokens=False)["input_ids"]
        return [*ids, self.eos_id]

    def __call__(self, group: Sequence[EpisodeTrajectory]) -> EpisodeTrajectory | None:
        """The demonstration for one group (episodes sharing a ``group_id``), or ``None`` when an episode reaches
        ``min_reward`` (it is its own SFT target) or the group has no gold answer."""
        if not group or max(ep.reward for ep in group) >= self.min_reward:
            return None
        # The prompt of the group's best episode (first of ties): the one SFT would have imitated.
        best = max(group, key=lambda ep: ep.reward)
        target = _target_step(best)
        if target is None or target.meta.gold_answer is None:
            return None
        return gold_demonstration(best, target, self.answer_ids(target.meta.gold_answer))
