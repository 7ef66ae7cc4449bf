"""Scoring responses with the HF backend: log-probs of given tokens and the argmax at each of their positions.

:func:`logprobs` and :func:`greedy_logprobs` are the scoring API (:meth:`~memrl.policy.engine.hf.HFPolicy.logprobs`
and :meth:`~memrl.policy.engine.hf.HFPolicy.greedy_logprobs` call them). On CPU they score one row at a time from
the prefix cache (:func:`score_row`), as prefill runs there (one unpadded row per prompt, from its longest cached
prefix); on an accelerator one padded batch of whole sequences (:func:`score_padded`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from memrl.policy.engine.kv_cache import preallocated_cache, prefix_filled_cache
from memrl.policy.errors import PolicyError

# The HFPolicy these functions score with (not imported: memrl.policy.engine.hf imports this module).
HFPolicy = Any

# Per (prompt, response): log p of each response token, the argmax token at each of its positions, its log p.
Scored = tuple[list[float], list[int], list[float]]


@torch.inference_mode()
def logprobs(
    policy: HFPolicy, sequences: Sequence[tuple[Sequence[int], Sequence[int]]], temperature: float = 1.0
) -> list[list[float]]:
    """log p(response_i | prompt, response_<i) under ``logits / temperature`` for each pair."""
    if temperature <= 0:
        raise PolicyError(f"logprobs: temperature must be > 0, got {temperature}")
    if scores_from_cache(policy):
        # Each prompt's states stay in the prefix cache: the forks of one memory write, scored on the same
        # question, build prompts that differ only from the forked fact on (snapshot credit).
        return [
            score_row(policy, list(map(int, p)), list(map(int, r)), temperature, keep_prompt=True)[0]
            for p, r in sequences
        ]
    step = policy.cfg.score_batch_size
    return [
        lps
        for start in range(0, len(sequences), step)
        for lps, _, _ in score_padded(policy, sequences[start : start + step], temperature)
    ]


@torch.inference_mode()
def greedy_logprobs(
    policy: HFPolicy, sequences: Sequence[tuple[Sequence[int], Sequence[int]]]
) -> list[Scored]:
    """Per (prompt, response): log p of each response token, the greedy (argmax) token at each of its positions
    and that token's log p. The response is what greedy decoding of the prompt writes exactly when the two agree
    everywhere (up to floating-point ties): one forward checks a reply that decoding would take a call per token
    to write (:mod:`memrl.memory.write_cache` checks another writer's cached reply so); where they first differ,
    the greedy token there continues the greedy reply."""
    if scores_from_cache(policy):
        return [score_row(policy, list(map(int, p)), list(map(int, r)), 1.0) for p, r in sequences]
    step = policy.cfg.score_batch_size
    out: list[Scored] = []
    for start in range(0, len(sequences), step):
        out.extend(score_padded(policy, sequences[start : start + step], 1.0))
    return out


def scores_from_cache(policy: HFPolicy) -> bool:
    """Scoring runs one unpadded row at a time from the prefix cache (CPU, as prefill does: see
    :data:`memrl.policy.engine.hf.RAGGED_MIN_TOKENS`); an accelerator scores a padded batch of whole sequences."""
    return policy.ragged_prefill and policy.prefix_cache.budget_tokens > 0


def score_row(
    policy: HFPolicy, prompt: list[int], resp: list[int], temperature: float, keep_prompt: bool = False
) -> Scored:
    """:data:`Scored` of one (prompt, response) as decoding computes it (CPU): from the prompt's longest cached
    prefix (a writer's instructions, say), in one unpadded forward over the rest and the response
    but its last token (whose logits predict nothing scored). Where the response first
    departs from the argmax, the states of the prompt and the response before that token are left in the prefix
    cache: decoding that continues from the argmax token there computes that one token, not the prompt again.
    ``keep_prompt``: the prompt's states are left there too (the next prompt may share more than its start)."""
    if not prompt:
        raise PolicyError("logprobs: sequence has an empty prompt (need >= 1 token to condition on)")
    if len(prompt) + len(resp) > policy.max_model_len:
        raise PolicyError(
            f"logprobs: sequence has {len(prompt) + len(resp)} tokens > max_model_len={policy.max_model_len}"
        )
    if not resp:
        return [], [], []
    seq = prompt + resp[:-1]  # fed; position len(prompt) - 1 + j predicts resp[j]
    match = policy.prefix_cache.match(prompt[:-1])
    cached = match.length if match is not None else 0
    if cached:
        cache = prefix_filled_cache(policy._num_layers(), len(seq), [(match.states(), cached)], cached)
    else:
        cache = preallocated_cache(policy._num_layers(), len(seq))
    ids = torch.tensor([seq[cached:]], device=policy.device)
    pos = torch.arange(cached, len(seq), device=policy.device)[None]
    t0 = time.perf_counter()
    with policy._own_forward():
        logits = policy.model(
            input_ids=ids,
            position_ids=pos,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=len(resp),
            **(policy.causal_tail_kwargs() if cached else {}),
            **policy.window_kwargs(None, pos, cache),
        ).logits[0]  # [len(resp), V]
    stats = policy.forward_stats
    stats["check_calls"] += 1
    stats["check_tokens"] += ids.shape[1]
    stats["check_seconds"] += time.perf_counter() - t0
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    best = logp.max(-1)
    greedy = best.indices.tolist()
    j = next((k for k, (a, b) in enumerate(zip(resp, greedy, strict=True)) if a != b), len(resp))
    keep = len(prompt) if keep_prompt else 0
    if j < len(resp):
        keep = max(keep, len(prompt) + j)
    if keep:
        states = [(layer.keys[0], layer.values[0]) for layer in cache.layers]

        def take(start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
            return [k[:, start:end].clone() for k, _ in states], [v[:, start:end].clone() for _, v in states]

        policy.prefix_cache.insert(seq[:keep], take)
    return logp[torch.arange(len(resp)), torch.tensor(resp)].tolist(), greedy, best.values.tolist()


def score_padded(policy: HFPolicy, chunk, temperature: float) -> list[Scored]:
    """:data:`Scored` of whole sequences in one left-padded forward (an accelerator fills its device with the
    batch)."""
    pairs = [(list(map(int, p)), list(map(int, r))) for p, r in chunk]
    for i, (p, r) in enumerate(pairs):
        if not p:
            raise PolicyError(f"logprobs: sequence {i} has an empty prompt (need >= 1 token to condition on)")
        if len(p) + len(r) > policy.max_model_len:
            raise PolicyError(
                f"logprobs: sequence {i} has {len(p) + len(r)} tokens > max_model_len={policy.max_model_len}"
            )
    L = max(len(p) + len(r) for p, r in pairs)
    keep = max(len(r) for _, r in pairs) + 1
    ids = torch.full((len(pairs), L), policy.pad_id, dtype=torch.long)
    mask = torch.zeros((len(pairs), L), dtype=torch.long)
    for i, (p, r) in enumerate(pairs):  # left-padded: every response ends at the right edge
        seq = p + r
        ids[i, L - len(seq) :] = torch.tensor(seq)
        mask[i, L - len(seq) :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with policy._own_forward():
        logits = policy.model(
            input_ids=ids.to(policy.device),
            attention_mask=mask.to(policy.device),
            position_ids=pos.to(policy.device),
            logits_to_keep=keep,
        ).logits  # [B, keep, V]: positions L-keep .. L-1
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    out = []
    for i, (_, r) in enumerate(pairs):
        if not r:
            out.append(([], [], []))
            continue
        # Token r[j] sits at L-len(r)+j and is predicted by position L-len(r)+j-1 = column keep-len(r)-1+j.
        cols = torch.arange(keep - len(r) - 1, keep - 1)
        best = logp[i, cols].max(-1)
        out.append((logp[i, cols, torch.tensor(r)].tolist(), best.indices.tolist(), best.values.tolist()))
    return out
