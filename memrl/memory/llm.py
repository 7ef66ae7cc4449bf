"""Adapter: a :class:`~memrl.policy.base.PolicyClient` (+ its tokenizer) → ``generate_text(prompts) -> texts``.

The llm fact extractor and compressor only need text in, text out; this wraps the token-level client: each
prompt becomes a single user message (chat template when the tokenizer has one, else
:data:`memrl.templates.PLAIN_CHAT_FORMAT`), one batched ``generate`` call, greedy by default.
"""

from __future__ import annotations

from memrl.memory.extract import TextGenerator
from memrl.policy.base import GenerationRequest, PolicyClient, SamplingParams
from memrl.templates import encode_chat


def policy_text_generator(
    client: PolicyClient, *, max_tokens: int = 256, temperature: float = 0.0, seed: int | None = 0
) -> TextGenerator:
    """>>> system = MemorySystem(MemoryConfig(extractor="llm"), generate_text=policy_text_generator(client))"""
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    tokenizer = client.tokenizer

    def generate_text(prompts: list[str]) -> list[str]:
        if not prompts:
            return []
        requests = [
            GenerationRequest(tuple(encode_chat(tokenizer, [{"role": "user", "content": p}])), params)
            for p in prompts
        ]
        outputs = client.generate(requests)
        if len(outputs) != len(prompts):
            raise RuntimeError(f"policy returned {len(outputs)} results for {len(prompts)} prompts")
        return [tokenizer.decode(list(outs[0].token_ids), skip_special_tokens=True) for outs in outputs]

    # The policy extractor (memrl.memory.writer) needs token ids and log-probs, not text: it reads the client.
    generate_text.client = client  # type: ignore[attr-defined]
    return generate_text
