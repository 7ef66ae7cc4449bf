from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from memrl.data.batch import TrajectoryBatchBuilder
from memrl.data.config import BatchConfig
from memrl.data.dataproto import to_dataproto
from memrl.types import EpisodeTrajectory, StepMeta, StepTrajectory


def episodes():
    def step(sid, prompt, response, mask):
        return StepTrajectory(
            step_id=sid,
            prompt_ids=prompt,
            response_ids=response,
            response_mask=mask,
            logprobs=[-0.5 * m for m in mask],
            turn_id=sid,
            meta=StepMeta(turn_id=sid, node_path=(len(sid),)),
        )

    return [
        EpisodeTrajectory(
            episode_id=f"e{k}",
            group_id=f"g{k // 2}",
            steps=(
                step(f"e{k}a", [1, 2, 3][: k + 1], [4, 5], [1, 0]),
                step(f"e{k}b", [6], [7, 8, 9], [1, 1, 1]),
            ),
            reward=float(k % 2),
            status="completed",
            step_rewards_ext=(None, 0.5),
        )
        for k in range(4)
    ]


def test_missing_verl_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "verl", None)  # makes `import verl` raise ImportError
    batch = TrajectoryBatchBuilder().build(episodes())
    with pytest.raises(ImportError, match=r"memrl\[verl\].*verl --no-deps tensordict codetiming"):
        to_dataproto(batch)


@pytest.mark.verl
def test_dataproto_fields_and_verl_operations():
    verl = pytest.importorskip("verl")
    batch = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(episodes())
    data = to_dataproto(batch)  # packed input is re-laid out to verl's padded rows
    assert isinstance(data, verl.DataProto) and len(data) == 8
    keys = set(data.batch.keys())  # TensorDict has no `in`; compare key sets
    assert {"prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"} <= keys
    assert {"token_level_scores", "token_level_rewards", "rm_scores", "rollout_log_probs"} <= keys
    assert "old_log_probs" not in keys  # verl's trainer computes and unions it in
    assert data.batch["input_ids"].shape == (
        8,
        data.batch["prompts"].shape[1] + data.batch["responses"].shape[1],
    )
    assert data.batch["token_level_scores"].sum(-1).tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    assert torch.equal(data.batch["rollout_log_probs"][0], torch.tensor([-0.5, 0.0, 0.0]))
    assert list(data.non_tensor_batch["uid"]) == ["g0"] * 4 + ["g1"] * 4  # GRPO groups
    assert list(data.non_tensor_batch["step_ids"]) == batch.step_ids
    assert data.non_tensor_batch["step_meta"][3] == batch.step_meta[3]
    assert list(data.non_tensor_batch["step_rewards_ext"]) == [None, 0.5] * 4

    parts = data.chunk(2)
    assert [len(p) for p in parts] == [4, 4]
    assert list(parts[1].non_tensor_batch["episode_ids"]) == ["e2", "e2", "e3", "e3"]
    again = verl.DataProto.concat(parts)
    assert torch.equal(again.batch["input_ids"], data.batch["input_ids"])
    assert list(again.non_tensor_batch["uid"]) == list(data.non_tensor_batch["uid"])

    recomputed = verl.DataProto.from_dict(
        tensors={"old_log_probs": torch.zeros_like(data.batch["rollout_log_probs"])},
        non_tensors={"uid": np.array(list(data.non_tensor_batch["uid"]), dtype=object)},
    )
    merged = data.union(recomputed)
    assert {"old_log_probs", "prompts"} <= set(merged.batch.keys())
    with_old = to_dataproto(batch, include_old_log_probs=True)
    assert torch.equal(with_old.batch["old_log_probs"], with_old.batch["rollout_log_probs"])
