from __future__ import annotations

import numpy as np
import pytest
import torch

from memrl.registry import RegistryError
from memrl.train.advantages import ADVANTAGES, compute_advantages, sample_weights, token_advantages
from memrl.types import StepMeta


def _batch(seed: int = 0, n_groups: int = 5, n: int = 4, resp_len: int = 7):
    g = torch.Generator().manual_seed(seed)
    b = n_groups * n
    scores = torch.randint(0, 2, (b,), generator=g).float() + 0.1 * torch.rand(b, generator=g)
    scores[:n] = 1.0  # one group with zero variance
    mask = (torch.rand(b, resp_len, generator=g) > 0.2).float()
    mask[:, 0] = 1.0
    gids = [f"p{i // n}" for i in range(b)]
    gids.append("lonely")  # a group of one
    scores = torch.cat([scores, torch.tensor([0.7])])
    mask = torch.cat([mask, torch.ones(1, resp_len)])
    return scores, mask, gids


def _verl():
    return pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl not importable")


@pytest.mark.verl
@pytest.mark.parametrize(
    "ours,theirs,kwargs",
    [
        ("grpo", "compute_grpo_outcome_advantage", {}),
        ("drgrpo", "compute_grpo_outcome_advantage", {"norm_adv_by_std_in_grpo": False}),
        ("rloo", "compute_rloo_outcome_advantage", {}),
    ],
)
def test_matches_verl(ours, theirs, kwargs):
    core = _verl()
    scores, mask, gids = _batch()
    # verl reads the outcome reward as the sum of token-level rewards: put it on the last token.
    tlr = torch.zeros_like(mask)
    tlr[:, -1] = scores
    ref, _ = getattr(core, theirs)(tlr, mask, np.array(gids, dtype=object), **kwargs)
    got = token_advantages(compute_advantages(ours, scores, gids), mask)
    assert got.shape == ref.shape
    assert torch.allclose(got, ref.float(), atol=1e-6), (got - ref).abs().max()


def test_grpo_is_group_normalised():
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 5.0, 5.0])
    adv = compute_advantages("grpo", scores, ["a"] * 4 + ["b"] * 2)
    assert torch.allclose(adv[:4].mean(), torch.tensor(0.0), atol=1e-6)
    assert torch.allclose(adv[:4].std(), torch.tensor(1.0), atol=1e-4)
    assert torch.all(adv[4:] == 0)  # no variance, no signal


def test_drgrpo_keeps_scale_rloo_leaves_one_out():
    scores = torch.tensor([3.0, 1.0, 2.0])
    g = ["x"] * 3
    assert torch.allclose(compute_advantages("drgrpo", scores, g), torch.tensor([1.0, -1.0, 0.0]))
    assert torch.allclose(compute_advantages("rloo", scores, g), torch.tensor([1.5, -1.5, 0.0]))


def test_none_is_zero_for_every_group():
    scores = torch.tensor([3.0, 1.0, 2.0, 0.0])
    adv = compute_advantages("none", scores, ["x", "x", "y", "y"])
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]


def test_duplicates_do_not_enter_group_statistics():
    meta = [StepMeta(), StepMeta(), StepMeta(), StepMeta(is_duplicate=True)]
    w = sample_weights(meta)
    assert w.tolist() == [1.0, 1.0, 1.0, 0.0]
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv = compute_advantages("grpo", scores, ["g"] * 4, w)
    ref = compute_advantages("grpo", scores[:3], ["g"] * 3)
    assert torch.allclose(adv[:3], ref)


def test_unknown_estimator_lists_choices():
    with pytest.raises(RegistryError, match="grpo"):
        ADVANTAGES.get("ppo-gae-nope")


def test_shape_errors_are_explicit():
    with pytest.raises(ValueError, match="same length"):
        compute_advantages("grpo", torch.zeros(3), ["a", "b"])
