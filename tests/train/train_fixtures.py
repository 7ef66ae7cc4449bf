"""Shared fixtures: a random-init tiny Llama (byte vocab) and synthetic episodes with real token ids."""

from __future__ import annotations

import random

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from memrl.types import EpisodeStatus, EpisodeTrajectory, StepMeta, StepTrajectory

VOCAB = 384


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    return LlamaForCausalLM(cfg)


def make_episodes(
    n_groups: int = 2,
    n_per_group: int = 4,
    seed: int = 0,
    duplicate_last: bool = False,
    shared_prompt: bool = False,
) -> list[EpisodeTrajectory]:
    """Groups of episodes with one target step each; rewards vary within a group; some tool tokens (mask 0).
    ``shared_prompt``: all members of a group have the same prompt (as GRPO groups do)."""
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        group_prompt = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(4, 12))]
        for k in range(n_per_group):
            prompt = (
                group_prompt
                if shared_prompt
                else [rng.randrange(3, VOCAB) for _ in range(rng.randrange(4, 12))]
            )
            resp = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 9))]
            mask = [1] * len(resp)
            if len(resp) > 4:
                mask[2] = 0  # an injected tool-result token
            lps = [-rng.random() * 3 if m else 0.0 for m in mask]
            dup = duplicate_last and k == n_per_group - 1
            step = StepTrajectory(
                step_id=f"g{g}e{k}s0",
                prompt_ids=prompt,
                response_ids=resp,
                response_mask=mask,
                logprobs=lps,
                turn_id="t",
                meta=StepMeta(turn_id="t", tree_id=f"tree{g}", is_duplicate=dup),
            )
            out.append(
                EpisodeTrajectory(
                    episode_id=f"g{g}e{k}",
                    group_id=f"g{g}",
                    steps=(step,),
                    reward=float(rng.random() < 0.5) if k else 1.0,
                    status=EpisodeStatus.COMPLETED,
                    sample_index=g * n_per_group + k,
                )
            )
    return out


def vowel_reward(options, ctx):
    """Test reward with signal on a random model's output: the share of ``a e i o u`` bytes in the response."""
    from memrl.rewards.base import PerItemReward

    def score(x) -> float:
        text = x.response or ""
        return sum(c in "aeiou" for c in text) / max(1, len(text))

    return PerItemReward("vowels", score)
