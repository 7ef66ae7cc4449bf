"""Build what the training loop needs from the root config, and publish updated adapters to the policy.

The policy and the trainer share one model in process: the HF backend generates with the very
:class:`~peft.PeftModel` the updater trains, so "hot-swapping" the adapter is only dropping the backend's cached
prefix states. Any other backend (vLLM, a server) gets the adapter written to disk in PEFT format and loaded by
``policy.load_adapter(path)`` (vLLM serves it as a LoRA request).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from memrl.config import Config
from memrl.data.config import DataConfig
from memrl.policy.base import Capability, require
from memrl.policy.config import PolicyConfig
from memrl.rollout.config import TreeConfig
from memrl.train.config import LoraConfig
from memrl.train.demonstrations import GoldDemonstrations, ProgramRunner
from memrl.train.lora import attach_lora, load_adapter_weights, save_adapter
from memrl.train.microbatch import checkpoint_prompts
from memrl.train.replay import ReplayBuffer
from memrl.train.updater import PolicyUpdater

if TYPE_CHECKING:  # the heavy modules load inside build_resources, when a run starts
    from peft import PeftModel

    from memrl.data.batch import TrajectoryBatchBuilder
    from memrl.data.buffer import RolloutBuffer
    from memrl.episode.runner import EpisodeRunner
    from memrl.policy.base import PolicyClient
    from memrl.types import BatchInput

logger = logging.getLogger(__name__)


@dataclass
class TrainResources:
    cfg: Config
    model: PeftModel  # the model being trained
    policy: PolicyClient  # generates the rollouts
    runner: EpisodeRunner  # training rollouts
    eval_runner: EpisodeRunner  # held-out evaluation (greedy, one chain per question)
    eval_inputs: list[BatchInput]  # the in-run evaluation subset (train.eval_episodes of train.eval_split)
    # Start and final evaluation (train.final_eval_episodes of train.final_eval_split); without a split of its
    # own the in-run subset is its head.
    final_eval_inputs: list[BatchInput]
    buffer: RolloutBuffer  # over the training data source
    builder: TrajectoryBatchBuilder
    updater: PolicyUpdater
    replay: ReplayBuffer | None
    shares_model: bool

    def reseed(self, seed: int) -> None:
        """Make the next rollouts a function of ``seed`` only (per-request seeds derive from these)."""
        for runner in (self.runner, self.eval_runner):
            runner.rollout_cfg = dataclasses.replace(runner.rollout_cfg, seed=seed % 2**31)
        source = getattr(
            self.policy, "_seed_source", None
        )  # the HF backend's seed stream for unseeded requests
        if isinstance(source, torch.Generator):
            source.manual_seed(seed)


def eval_config(cfg: Config) -> Config:
    """Evaluation is fixed and strategy-independent: greedy, one chain per held-out question, scored by
    ``train.eval_reward`` when set (else the episode reward). The tree settings are reset: a chain never reads
    them, and they would otherwise split the cached start evaluation of one setup across its chain and tree arms."""
    rollout = dataclasses.replace(cfg.rollout, strategy="chain", n=1, temperature=0.0, tree=TreeConfig())
    episode = cfg.episode
    if cfg.train.eval_reward is not None:
        episode = dataclasses.replace(episode, reward=cfg.train.eval_reward, reward_options={})
    return dataclasses.replace(cfg, rollout=rollout, episode=episode)


def load_split(data: DataConfig, split: str, limit: int | None) -> list[BatchInput]:
    from memrl.data.adapters import load_dataset

    inputs, report = load_dataset(dataclasses.replace(data, split=split, limit=limit))
    if report.skipped:
        logger.warning("data (%s): %d records skipped: %s", split, report.skipped, report.reasons()[:3])
    if not inputs:
        raise ValueError(f"data.adapter={data.adapter!r} split={split!r} gave no episodes; check data.*")
    return inputs


def evaluation_inputs(cfg: Config) -> tuple[list[BatchInput], list[BatchInput]]:
    """The in-run evaluation inputs (``train.eval_episodes`` of ``train.eval_split``) and the start/final ones
    (``train.final_eval_episodes`` of ``train.final_eval_split``; without a split of their own, of the same split,
    the in-run subset being their head)."""
    tc = cfg.train
    final_n = tc.eval_episodes if tc.final_eval_episodes is None else tc.final_eval_episodes
    if tc.final_eval_split in (None, tc.eval_split):
        inputs = load_split(cfg.data, tc.eval_split, max(final_n, tc.eval_episodes))
        return inputs[: tc.eval_episodes], inputs[:final_n]
    final = load_split(cfg.data, tc.final_eval_split, final_n) if final_n else []
    return load_split(cfg.data, tc.eval_split, tc.eval_episodes), final


def _model_and_policy(
    policy: PolicyConfig, lora: LoraConfig, per_role: bool = False
) -> tuple[PeftModel, PolicyClient, bool]:
    """The trained model, the client that generates with it, and whether the two share the module."""
    from memrl.policy.engine.hf import HFPolicy
    from memrl.policy.engine.load import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(dataclasses.replace(policy, lora_path=None))
    model = attach_lora(model, lora, per_role=per_role)
    if policy.lora_path:
        # Training goes on from a saved adapter (both roles' with per_role): a writer warm-started in one run
        # beside an answer adapter trained in another, trained on by RL without redoing either.
        load_adapter_weights(model, policy.lora_path)
    if policy.backend == "hf":
        return model, HFPolicy.from_model(model, tokenizer, policy), True
    from memrl.policy import make_policy

    # Another backend serves the trained adapters as files, published after each update (publish_adapter).
    client = make_policy(dataclasses.replace(policy, enable_lora=True))
    if per_role:
        require(
            client,
            Capability.ADAPTERS,
            "train.role_adapters=per_role (the writer's adapter, served per call)",
        )
    return model, client, False


def build_resources(cfg: Config) -> TrainResources:
    if cfg.train.kl_reference == "start" and not cfg.policy.lora_path:
        raise ValueError(
            "train.kl_reference: start anchors RL to the adapter the run starts from; set policy.lora_path"
        )
    from memrl.data.batch import TrajectoryBatchBuilder
    from memrl.data.buffer import RolloutBuffer
    from memrl.data.datasource import RolloutDataSource
    from memrl.episode.build import build_runner

    rc = cfg.train.replay
    if rc.batch_size and rc.demonstrations == "gold_program" and "python" not in cfg.tools.enabled:
        raise ValueError(
            "train.replay.demonstrations=gold_program demonstrates python calls, but tools.enabled="
            f"{cfg.tools.enabled} has no python: add it, or use demonstrations=gold"
        )
    torch.manual_seed(cfg.seed)
    per_role = cfg.train.role_adapters == "per_role"
    model, policy, shares = _model_and_policy(cfg.policy, cfg.train.lora, per_role)
    checkpoint_prompts(model, cfg.train.checkpoint_prompt_tokens)
    train_inputs = load_split(cfg.data, cfg.data.split, cfg.data.limit)
    eval_inputs, final_eval_inputs = evaluation_inputs(cfg)
    # A writer that no step trains writes as it will at test (greedy), so answers train on that memory.
    runner = build_runner(cfg, policy=policy, sample_writes="memory" in cfg.train.roles)
    eval_runner = build_runner(eval_config(cfg), policy=policy)
    builder = TrajectoryBatchBuilder(cfg.data.batch)
    replay = None
    rc = cfg.train.replay
    if rc.batch_size > 0:
        # Demonstrations are tokenized exactly as the policy reads and writes text: with its own tokenizer.
        demonstrate = None
        if rc.demonstrations != "none":
            run_program = ProgramRunner(cfg.tools) if rc.demonstrations == "gold_program" else None
            demonstrate = GoldDemonstrations(
                policy.tokenizer, rc.min_reward, memory=rc.memory_demonstrations, run_program=run_program
            )
        replay = ReplayBuffer(rc.capacity, builder.build, seed=cfg.seed, demonstrate=demonstrate)
    return TrainResources(
        cfg=cfg,
        model=model,
        policy=policy,
        runner=runner,
        eval_runner=eval_runner,
        eval_inputs=eval_inputs,
        final_eval_inputs=final_eval_inputs,
        buffer=RolloutBuffer.from_config(cfg.data, RolloutDataSource.from_config(cfg.data, train_inputs)),
        builder=builder,
        updater=PolicyUpdater(model, cfg.train, temperature=cfg.rollout.temperature),
        replay=replay,
        shares_model=shares,
    )


def publish_adapter(res: TrainResources, step: int) -> None:
    """Make the policy generate with the freshly updated adapter."""
    res.model.eval()
    if res.shares_model:
        res.policy.invalidate_cache()  # same module: weights are already live; cached KV states are stale
        return
    path = save_adapter(res.model, Path(res.cfg.output_dir) / "live_adapter" / f"step_{step:06d}")
    res.policy.load_adapter(path)
