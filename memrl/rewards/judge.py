"""``llm_judge``: an LLM grades each answer yes/no through any PolicyClient (one batched generate call).

The prompt is ``memrl/prompts/llm_judge.j2`` (LongMemEval-style grading). The judge's reply is parsed for a leading
yes / no; a reply that is neither scores 0 and is counted in :attr:`LLMJudge.unparsed` (logged, not hidden).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.rewards.base import REWARDS, RewardConfigError, RewardContext, RewardFn, RewardInput, check_options
from memrl.rewards.benchmarks import is_abstention_question
from memrl.templates import encode_chat, load_template

logger = logging.getLogger(__name__)
_FIRST_WORD = re.compile(r"[a-z]+")


@dataclass
class LLMJudge:
    policy: Any
    template: str = "llm_judge.j2"
    max_tokens: int = 8
    name: str = "llm_judge"
    unparsed: int = 0
    last_replies: list[str] = field(default_factory=list)

    def prompt_ids(self, x: RewardInput) -> list[int]:
        text = load_template(self.template).render(
            question=x.question,
            gold=x.gold or "",
            answer=x.answer,
            abstention=is_abstention_question(x.metadata) or x.gold is None,
        )
        return encode_chat(self.policy.tokenizer, [{"role": "user", "content": text.strip()}])

    def __call__(self, inputs: Sequence[RewardInput]) -> list[float]:
        from memrl.policy.base import GenerationRequest, SamplingParams

        if not inputs:
            return []
        params = SamplingParams(temperature=0.0, max_tokens=self.max_tokens)
        requests = [GenerationRequest(prompt_ids=tuple(self.prompt_ids(x)), params=params) for x in inputs]
        outputs = self.policy.generate(requests)
        decode = self.policy.tokenizer.decode
        self.last_replies = [decode(list(out[0].token_ids), skip_special_tokens=True) for out in outputs]
        return [self._parse(r) for r in self.last_replies]

    def _parse(self, reply: str) -> float:
        match = _FIRST_WORD.search(reply.lower())
        head = match.group(0) if match else ""
        if head in ("yes", "correct"):
            return 1.0
        if head in ("no", "wrong", "incorrect"):
            return 0.0
        self.unparsed += 1
        logger.warning("llm_judge: reply %r is neither yes nor no; scored 0", reply[:80])
        return 0.0


@REWARDS.register("llm_judge")
def make_llm_judge(options: Mapping[str, Any], ctx: RewardContext) -> RewardFn:
    opts = check_options("llm_judge", options, {"template": "llm_judge.j2", "max_tokens": 8})
    if ctx.policy is None:
        raise RewardConfigError(
            "reward 'llm_judge' needs a PolicyClient as judge (RewardContext.policy); none was given"
        )
    return LLMJudge(ctx.policy, template=opts["template"], max_tokens=int(opts["max_tokens"]))
