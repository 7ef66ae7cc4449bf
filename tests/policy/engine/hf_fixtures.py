"""Helpers shared by the HF engine's tests (decode, scoring, adapters): tiny random Llamas and reference forwards."""

from __future__ import annotations

import torch

from memrl.policy.base import SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.hf import HFPolicy
from memrl.testing import random_tiny_llama

PROMPTS = ("Alice: I moved to Lisbon in May.", "Q?", "Bob bought a red bike; what colour is it?")


def enc(policy, text: str) -> tuple[int, ...]:
    return tuple(policy.tokenizer.encode(text, add_special_tokens=False))


def greedy(max_tokens=12, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


@torch.no_grad()
def manual_greedy(model, prompt, steps):
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


@torch.no_grad()
def forward_logsoftmax(model, prompt, out, temperature=1.0):
    """log p(out_j | prompt, out_<j) from one full forward pass, ``[len(out), V]``."""
    ids = torch.tensor([list(prompt) + list(out)])
    logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits / temperature, dim=-1)


def peaked() -> HFPolicy:
    """A random tiny Llama with larger weights, so its greedy outputs vary instead of repeating one byte."""
    model, tok = random_tiny_llama(seed=3, initializer_range=0.3)
    return HFPolicy.from_model(model, tok, PolicyConfig(model="random-peaked", seed=0))
