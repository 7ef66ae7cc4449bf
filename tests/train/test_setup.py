from __future__ import annotations

import types

import torch

from memrl.data.batch import TrajectoryBatchBuilder
from memrl.data.config import BatchConfig
from memrl.policy.engine.hf import HFPolicy
from memrl.testing import random_tiny_llama
from memrl.train.config import LoraConfig, TrainConfig
from memrl.train.lora import attach_lora
from memrl.train.setup import TrainResources, eval_config, publish_adapter
from memrl.train.updater import PolicyUpdater
from tests.train.train_fixtures import make_episodes


def _resources(tmp_path, policy, model, shares):
    cfg = types.SimpleNamespace(output_dir=str(tmp_path))
    fields = dict.fromkeys(TrainResources.__dataclass_fields__)
    fields.update(cfg=cfg, model=model, policy=policy, shares_model=shares, updater=None, replay=None)
    return TrainResources(**fields)


def test_adapter_is_hot_swapped_into_a_separate_backend_by_path(tmp_path):
    """The path vLLM takes (LoRA request from a PEFT dir), exercised with a second, independent HF model."""
    trained, tok = random_tiny_llama(0)
    trained = attach_lora(trained, LoraConfig(r=4, alpha=8))
    serving, _ = random_tiny_llama(0)
    policy = HFPolicy.from_model(serving, tok)
    batch = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(make_episodes())
    PolicyUpdater(trained, TrainConfig(lr=5e-2, lora=LoraConfig(r=4, alpha=8))).update(batch)
    ids = torch.randint(3, 300, (1, 16))
    with torch.no_grad():
        before = policy.model(ids).logits
        publish_adapter(_resources(tmp_path, policy, trained, shares=False), step=1)
        after = policy.model(ids).logits
        want = trained.eval()(ids).logits
    assert not torch.allclose(before, want, atol=1e-5)
    assert torch.allclose(after, want, atol=1e-5)
    assert (tmp_path / "live_adapter" / "step_000001" / "adapter_config.json").is_file()


def test_evaluation_is_greedy_single_chain_whatever_the_training_strategy():
    from memrl.config import load_config

    cfg = load_config(None, ["rollout.strategy=tree", "rollout.n=8", "rollout.temperature=1.0"])
    ev = eval_config(cfg)
    assert (ev.rollout.strategy, ev.rollout.n, ev.rollout.temperature) == ("chain", 1, 0.0)
    assert cfg.rollout.strategy == "tree"  # the training config is untouched


def test_chain_and_tree_arms_of_one_setup_share_the_start_evaluation():
    from types import SimpleNamespace

    from memrl.config import load_config
    from memrl.train.loop import start_eval_key

    def key(*overrides):
        return start_eval_key(SimpleNamespace(cfg=load_config(None, list(overrides)), final_eval_inputs=[]))

    chain = key()
    assert (
        key("rollout.strategy=tree", "rollout.tree.expansion_policy=tool_call", "rollout.tree.beam_size=4")
        == chain
    )
    assert key("rollout.rollback.enable_tool_rollback=true") != chain  # rollback acts in a greedy chain too


def test_evaluation_scores_with_eval_reward_when_training_on_a_shaped_one():
    from memrl.config import load_config
    from memrl.rewards import make_reward

    shaped = [
        "episode.reward=composite",
        "episode.reward_options={parts: {exact_match: 1.0, char_similarity: 0.5}}",
    ]
    cfg = load_config(None, shaped)
    assert eval_config(cfg).episode.reward == "composite"  # default: the training reward
    cfg = load_config(None, [*shaped, "train.eval_reward=exact_match"])
    ev = eval_config(cfg)
    assert (ev.episode.reward, ev.episode.reward_options) == ("exact_match", {})
    assert cfg.episode.reward == "composite"
    make_reward(ev.episode.reward, ev.episode.reward_options)  # the options fit the eval reward


def test_in_run_and_final_evaluation_draw_from_their_own_splits(tmp_path):
    """LoCoMo's memory_r1 split: the in-run curve on the validation conversation, start/final on the test ones."""
    import json

    from memrl.adapters import LOCOMO_FIXTURE
    from memrl.config import load_config
    from memrl.train.setup import evaluation_inputs

    raw = json.loads(LOCOMO_FIXTURE.read_text())[0]
    path = tmp_path / "locomo.json"
    path.write_text(
        json.dumps([{**raw, "sample_id": s} for s in ("conv-26", "conv-30", "conv-41", "conv-42")])
    )
    common = ["data.adapter=locomo", f"data.path={path}", "data.options={split_scheme: memory_r1}"]
    cfg = load_config(
        None,
        [
            *common,
            "train.eval_split=validation",
            "train.eval_episodes=5",
            "train.final_eval_split=test",
            "train.final_eval_episodes=12",
        ],
    )
    in_run, final = evaluation_inputs(cfg)
    assert len(in_run) == 5 and {bi.metadata["sample_id"] for bi in in_run} == {"conv-30"}
    assert len(final) == 12 and {bi.metadata["sample_id"] for bi in final} == {"conv-41", "conv-42"}
    cfg = load_config(
        None, [*common, "train.eval_split=test", "train.eval_episodes=3", "train.final_eval_episodes=10"]
    )
    in_run, final = evaluation_inputs(cfg)  # one split: the in-run subset is the head of the final one
    assert [bi.episode_id for bi in in_run] == [bi.episode_id for bi in final[:3]] and len(final) == 10
    for split in ("test", "validation"):  # 0: no start/final evaluation, from a split of its own or not
        cfg = load_config(None, [*common, "train.eval_split=validation", "train.eval_episodes=3",
                                 f"train.final_eval_split={split}", "train.final_eval_episodes=0"])  # fmt: skip
        in_run, final = evaluation_inputs(cfg)
        assert len(in_run) == 3 and final == []
