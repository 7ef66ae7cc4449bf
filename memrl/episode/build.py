"""Build an :class:`EpisodeRunner` and its resources (policy, memory, tools, reward) from the root config.

Each component receives only its own sub-config. ``policy`` may be passed in (a worker that already holds a
backend, a test with a scripted policy); otherwise it is built with :func:`memrl.policy.make_policy`.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from memrl.config import Config
from memrl.episode.runner import EpisodeRunner
from memrl.registry import import_plugins
from memrl.rewards.base import RewardContext, make_reward
from memrl.rollout.config import RolloutConfig

logger = logging.getLogger(__name__)


class CachingEmbedder:
    """Embedder wrapper that encodes each distinct text once (LRU of ``max_items`` vectors).

    Benchmarks ask many questions over one conversation (LoCoMo: ~200 questions per conversation), so the same
    history turns are ingested once per question-episode; caching their vectors turns repeated ingestion into
    dictionary lookups. New texts of one call are still encoded in a single batched ``encode`` call.
    """

    def __init__(self, inner: Any, max_items: int = 200_000) -> None:
        self.inner = inner
        self.dim = inner.dim
        self.max_items = max_items
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            vecs = self.inner.encode(missing)
            for text, vec in zip(missing, vecs, strict=True):
                self._cache[text] = vec
        self.misses += len(missing)
        self.hits += len(texts) - len(missing)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i] = self._cache[text]
            self._cache.move_to_end(text)
        while len(self._cache) > self.max_items:
            self._cache.popitem(last=False)
        return out

    def count_tokens(self, texts: Sequence[str]) -> list[int]:
        return self.inner.count_tokens(texts)

    def split_to_window(self, texts: Sequence[str]) -> list[list[str]]:
        from memrl.memory.embedder import window_chunks

        return window_chunks(self.inner, texts)  # chunks are cached here like any other text


def build_memory(cfg: Config, *, cache_embeddings: bool = True, policy: Any = None) -> Any:
    """The batch's MemorySystem. ``policy``: what ``memory.extractor=llm`` / ``memory.compressor=llm`` ask
    (greedy, ``memory.llm_max_tokens``); without one those settings fail with a message saying so."""
    from memrl.memory import MemorySystem
    from memrl.memory.embedder import build_embedder
    from memrl.memory.llm import policy_text_generator

    embedder = build_embedder(cfg.memory)
    if cache_embeddings:
        embedder = CachingEmbedder(embedder)
    generate_text = (
        None if policy is None else policy_text_generator(policy, max_tokens=cfg.memory.llm_max_tokens)
    )
    return MemorySystem(cfg.memory, embedder=embedder, generate_text=generate_text)


def build_tools(cfg: Config) -> tuple[Any, list[str]]:
    """The tool runner and the tool names shown in prompts; ``(None, [])`` when ``tools.enabled`` is empty."""
    if not cfg.tools.enabled:
        return None, []
    from memrl.tools import ToolExecutor

    return ToolExecutor(cfg.tools), list(cfg.tools.enabled)


def rollout_config_for(cfg: Config) -> RolloutConfig:
    return cfg.rollout


def build_runner(
    cfg: Config,
    *,
    policy: Any = None,
    context: str | None = None,
    cache_embeddings: bool = True,
    sample_writes: bool = True,
) -> EpisodeRunner:
    """An EpisodeRunner for the root config ``cfg``; ``context`` overrides ``episode.context``;
    ``sample_writes=False`` writes policy memory greedily (:class:`EpisodeRunner`)."""
    import_plugins(cfg.plugins)  # a config handed to another process arrives without its plugins imported
    if policy is None:
        from memrl.policy import make_policy

        policy = make_policy(cfg.policy)
    episode_cfg = cfg.episode
    if context is not None and context != episode_cfg.context:
        episode_cfg = dataclasses.replace(episode_cfg, context=context)
    tools, tool_names = build_tools(cfg)
    reward = make_reward(episode_cfg.reward, episode_cfg.reward_options, RewardContext(policy=policy))
    return EpisodeRunner(
        episode_cfg,
        policy=policy,
        memory=build_memory(cfg, cache_embeddings=cache_embeddings, policy=policy),
        rollout_cfg=rollout_config_for(cfg),
        reward=reward,
        tools=tools,
        tool_names=tool_names,
        sample_writes=sample_writes,
    )
