from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from memrl.train.tree_advantages import tree_local_advantages
from memrl.types import ContractError, PathNode, StepMeta


def _meta(path):
    return StepMeta(tree_id="t", tree_path=[PathNode(u, p) for u, p in path])


def test_local_advantages_on_a_hand_built_tree():
    # root ─┬─ n (pos 4) ─┬─ a (r=1, 10 tokens)
    #       │             └─ b (r=0, 8 tokens, forked at n)
    #       └─ c (r=0, 6 tokens)       + one chain sample and one duplicate of b in the same group
    metas = [
        _meta([("root", 0), ("n", 4), ("a", 10)]),
        _meta([("root", 0), ("n", 4), ("b", 8)]),
        _meta([("root", 0), ("c", 6)]),
        StepMeta(),
        dataclasses.replace(_meta([("root", 0), ("n", 4), ("b", 8)]), is_duplicate=True),
    ]
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0])  # the duplicate's score must count nowhere
    weights = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    got = tree_local_advantages(metas, scores, ["g"] * 5, weights, [10, 8, 6, 5, 8])
    std = torch.tensor([1.0, 0.0, 0.0, 1.0]).std().item()  # counted rows only
    v_root, v_n = 1 / 3, 0.5  # tree leaves only: the chain sample has no node
    a, b, c, chain, _ = got
    assert chain is None
    assert torch.allclose(a[:4], torch.full((4,), (v_n - v_root) / std), atol=1e-6)
    assert torch.allclose(a[4:], torch.full((6,), (1 - v_n) / std), atol=1e-6)
    assert torch.equal(a[:4], b[:4])  # the shared prefix gets one credit
    assert torch.allclose(b[4:], torch.full((4,), (0 - v_n) / std), atol=1e-6)
    assert torch.allclose(c, torch.full((6,), (0 - v_root) / std), atol=1e-6)


def test_equal_rewards_give_no_local_credit_and_bad_paths_are_named():
    metas = [_meta([("r", 0), ("x", 2)]), _meta([("r", 0), ("y", 3)])]
    got = tree_local_advantages(metas, torch.ones(2), ["g", "g"], torch.ones(2), [5, 5])
    assert all(bool((t == 0).all()) for t in got)
    with pytest.raises(ValueError, match=r"row 0: tree_path positions must rise within the response"):
        tree_local_advantages([_meta([("r", 0), ("x", 9)])], torch.ones(1), ["g"], torch.ones(1), [5])
    # A node without a response position cannot be built: the contract rejects it where the path is made.
    with pytest.raises(ContractError, match=r"PathNode.pos: expected a response position"):
        PathNode("r", None)


def test_real_tree_leaves_share_credit_exactly_on_their_shared_prefix():
    from transformers import ByT5Tokenizer

    from memrl.rollout import RolloutConfig, RolloutRequest, TreeConfig, run_rollout
    from memrl.testing.scripted import ScriptedPolicy, random_script

    tok_bytes = ByT5Tokenizer()

    tree = TreeConfig(initial_rollouts=2, expansion_iterations=2, nodes_per_expansion=1, beam_size=4,
                      segment_tokens=6, expansion_policy="random")  # fmt: skip
    cfg = RolloutConfig(strategy="tree", n=8, tree=tree, max_response_tokens=60)
    prompt = list(tok_bytes.encode("Question: what did Caroline research?", add_special_tokens=False))
    pol = ScriptedPolicy(tok_bytes, random_script(min_tokens=20, max_tokens=40))
    [leaves] = run_rollout([RolloutRequest(prompt, "ep0")], pol, None, cfg).leaves
    scores = torch.tensor([float(i % 3 == 0) for i in range(len(leaves))])
    weights = torch.tensor([0.0 if s.meta.is_duplicate else 1.0 for s in leaves])
    local = tree_local_advantages(
        [s.meta for s in leaves], scores, ["g"] * len(leaves), weights, [len(s.response_ids) for s in leaves]
    )
    paths = [[n.uid for n in s.meta.tree_path] for s in leaves]
    shared_checked = 0
    for i in range(len(leaves)):
        assert local[i] is not None and len(local[i]) == len(leaves[i].response_ids)
        for j in range(i + 1, len(leaves)):
            k = 0
            while k < min(len(paths[i]), len(paths[j])) and paths[i][k] == paths[j][k]:
                k += 1
            pos = leaves[i].meta.tree_path[k - 1].pos
            assert leaves[i].response_ids[:pos] == leaves[j].response_ids[:pos]
            assert torch.equal(local[i][:pos], local[j][:pos])
            shared_checked += pos > 0
    assert shared_checked > 0  # forks after the first token exist, so some prefixes really are shared
    # Credit telescopes along each path: the first token's credit plus every later change adds up to the
    # leaf's score minus the root value, whatever the tree's shape.
    std = scores[weights > 0].std().item()
    root_value = scores[weights > 0].mean().item()
    for i, s in enumerate(leaves):
        if weights[i] == 0:
            continue
        starts = sorted({n.pos for n in s.meta.tree_path if n.pos < len(s.response_ids)})
        total = sum(float(local[i][p]) for p in starts)
        assert math.isclose(total * std, float(scores[i]) - root_value, abs_tol=1e-5)


def test_updater_adds_local_credit_to_tree_leaves_only():
    from memrl.data.batch import TrajectoryBatchBuilder
    from memrl.data.config import BatchConfig
    from memrl.train.config import LoraConfig, TrainConfig
    from memrl.train.lora import adapter_state, attach_lora
    from memrl.train.updater import PolicyUpdater
    from tests.train.train_fixtures import make_episodes, tiny_llama

    eps = make_episodes(n_groups=2, n_per_group=4, shared_prompt=True)
    treed = []
    for ep in eps:
        step = ep.steps[0]
        if ep.group_id == "g0":  # group g0 is a tree: two leaves forked at position 2 of the first one
            k = int(ep.episode_id[-1])
            path = [("root", 0), ("n", 2), (f"leaf{k}", len(step.response_ids))] if k < 2 else [
                ("root", 0), (f"leaf{k}", len(step.response_ids))]  # fmt: skip
            step = dataclasses.replace(step, meta=_meta(path))
        treed.append(dataclasses.replace(ep, steps=(step,)))
    batch = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(treed)
    after, metrics = {}, {}
    for w in (0.0, 1.0):
        model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
        cfg = TrainConfig(lr=1e-2, lora=LoraConfig(r=4, alpha=8), tree_local_weight=w)
        metrics[w] = PolicyUpdater(model, cfg).update(batch)
        after[w] = adapter_state(model)
    assert metrics[0.0]["train/tree_local_abs_mean"] == 0.0
    assert metrics[1.0]["train/tree_local_abs_mean"] > 0.0
    assert any(not torch.allclose(after[0.0][k], after[1.0][k]) for k in after[0.0])
    with pytest.raises(ValueError, match="tree_local_weight must be >= 0"):
        TrainConfig(tree_local_weight=-1.0)
