"""llm_judge: prompt from memrl/prompts/llm_judge.j2, one batched generate call, yes/no parsing, unparsed replies
counted. Scripted judge for the parsing logic; a real (random-init) HF tiny Llama for the real path."""

from __future__ import annotations

import pytest
from transformers import ByT5Tokenizer

from memrl.rewards import RewardConfigError, RewardContext, RewardInput, make_reward
from memrl.testing.scripted import ScriptedPolicy


def _inputs():
    return [
        RewardInput.from_response("<answer>Oslo</answer>", "Oslo", "Where does Ann live?"),
        RewardInput.from_response("<answer>Rome</answer>", "Oslo", "Where does Ann live?"),
        RewardInput.from_response(
            "<answer>no idea</answer>", None, "Where was Bo born?", {"abstention": True}
        ),
    ]


def test_scripted_judge_parses_yes_no_and_sees_the_right_prompt():
    tok = ByT5Tokenizer()
    prompts = []

    def judge(ctx):
        prompts.append(ctx.text)
        if "Gold answer" not in ctx.text:
            return "Maybe?"  # abstention prompt has no gold; unparsable reply
        return "Yes." if "Response: Oslo" in ctx.text else "no"

    policy = ScriptedPolicy(tok, judge)
    reward = make_reward("llm_judge", {}, RewardContext(policy=policy))
    assert reward(_inputs()) == [1.0, 0.0, 0.0]
    assert policy.stats.generate_calls == 1  # the whole batch in one call
    assert reward.unparsed == 1
    assert "Gold answer: Oslo" in prompts[0] and "cannot be answered" in prompts[2]


def test_real_hf_judge_returns_scores_for_every_input(tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from memrl.policy import PolicyConfig, make_policy

    torch.manual_seed(0)
    tok = ByT5Tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    policy = make_policy(PolicyConfig(model=str(tmp_path)))
    reward = make_reward("llm_judge", {"max_tokens": 4}, RewardContext(policy=policy))
    scores = reward(_inputs())
    assert len(scores) == 3 and all(s in (0.0, 1.0) for s in scores)
    assert len(reward.last_replies) == 3
    assert 0 <= reward.unparsed <= 3
    with pytest.raises(RewardConfigError, match="unknown option"):
        make_reward("llm_judge", {"temperature": 1.0}, RewardContext(policy=policy))
