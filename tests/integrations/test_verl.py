"""The verl hook on the real episode pipeline (random-init tiny model, real MiniLM memory, chain rollout)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

pytest.importorskip("verl", reason="verl not importable (pip install 'memrl[verl]')")
from verl import DataProto  # noqa: E402
from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage  # noqa: E402

from memrl.config import load_config  # noqa: E402
from memrl.data.adapters import run_adapter  # noqa: E402
from memrl.integrations.verl import INPUT_KEY, MemrlRollout, VerlHookError, group_rows, verl_dataset_rows  # noqa: E402
from memrl.train.advantages import compute_advantages, token_advantages  # noqa: E402
from memrl.types import to_dict  # noqa: E402

pytestmark = pytest.mark.verl
N = 3


@pytest.fixture(scope="module")
def rollout():
    from memrl.policy.hf import HFPolicy
    from memrl.testing import random_tiny_llama

    model, tok = random_tiny_llama(0)
    cfg = load_config(
        None,
        [
            "tools.enabled=[]",
            "rollout.max_response_tokens=6",
            "episode.prompt_token_budget=400",
            "episode.reward=exact_match",
        ],
    )
    return MemrlRollout.from_config(cfg, policy=HFPolicy.from_model(model, tok, cfg.policy))


def _verl_gen_batch(n_prompts: int = 2) -> DataProto:
    """What RayPPOTrainer.fit hands the rollout: dataset rows + uid, repeated n times interleaved."""
    inputs, _ = run_adapter(
        "synthetic",
        None,
        split="train",
        options={"num_episodes": n_prompts, "num_sessions": 2, "turns_per_session": 2},
    )
    rows = verl_dataset_rows(inputs)
    obj = lambda xs: np.array(xs + [None], dtype=object)[:-1]  # noqa: E731 - keep dicts as objects
    batch = DataProto.from_single_dict(
        {
            "dummy_tensor": torch.zeros(n_prompts, 1, dtype=torch.uint8),
            "data_source": np.array([r["data_source"] for r in rows], dtype=object),
            "extra_info": obj([r["extra_info"] for r in rows]),
            "uid": np.array([f"uid-{i}" for i in range(n_prompts)], dtype=object),
        }
    )
    batch.meta_info["temperature"] = 1.0
    return batch


@pytest.mark.slow
def test_dataproto_has_verl_fields_and_survives_chunk_concat_union(rollout):
    batch = _verl_gen_batch()
    gen = batch.repeat(repeat_times=N, interleave=True)
    out = rollout.generate_sequences(gen)
    assert len(out) == len(gen) == 2 * N
    keys = set(out.batch.keys())  # a TensorDict
    for key in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert key in keys, key
    assert "token_level_scores" in keys and "rm_scores" in keys
    r = out.batch["responses"].shape[1]
    assert out.batch["input_ids"].shape[1] == out.batch["prompts"].shape[1] + r
    assert list(out.non_tensor_batch["uid"]) == list(gen.non_tensor_batch["uid"])
    assert len(out.non_tensor_batch["step_meta"]) == len(out)
    # as fit does: repeat the dataset batch and union the rollout output into it
    merged = batch.repeat(repeat_times=N, interleave=True).union(out)
    assert torch.equal(merged.batch["responses"], out.batch["responses"])
    chunks = out.chunk(2)
    again = DataProto.concat(chunks)
    for key in keys:
        assert torch.equal(again.batch[key], out.batch[key]), key
    assert list(again.non_tensor_batch["uid"]) == list(out.non_tensor_batch["uid"])
    # verl's GRPO on the hook's output equals ours on the same rows
    scores = out.batch["token_level_scores"]
    mask = out.batch["response_mask"]
    ref, _ = compute_grpo_outcome_advantage(scores, mask, out.non_tensor_batch["uid"])
    ours = token_advantages(
        compute_advantages("grpo", scores.sum(-1), list(out.non_tensor_batch["uid"])), mask
    )
    assert torch.allclose(ours, ref, atol=1e-6)


def test_missing_episode_is_a_clear_error():
    batch = _verl_gen_batch(1)
    batch.non_tensor_batch.pop("extra_info")
    with pytest.raises(VerlHookError, match=INPUT_KEY):
        group_rows(batch)


def test_dataset_rows_round_trip():
    inputs, _ = run_adapter("synthetic", None, split="test", options={"num_episodes": 2})
    rows = verl_dataset_rows(inputs)
    assert rows[0]["extra_info"][INPUT_KEY] == to_dict(inputs[0])
    assert rows[1]["reward_model"]["ground_truth"] == inputs[1].target_answer
    assert dataclasses.is_dataclass(inputs[0])
