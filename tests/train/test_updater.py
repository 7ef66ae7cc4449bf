from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from memrl.data.batch import TrajectoryBatchBuilder
from memrl.data.config import BatchConfig
from memrl.train.config import LoraConfig, TrainConfig, WarmStartConfig
from memrl.train.lora import adapter_state, attach_lora, save_adapter
from memrl.train.microbatch import collate, seq_records, token_logprobs
from memrl.train.updater import PolicyUpdater
from memrl.types import MemoryWrite, StepMeta, StepRole, TurnRole
from tests.train.train_fixtures import make_episodes, tiny_llama


def _build(episodes, layout):
    return TrajectoryBatchBuilder(BatchConfig(layout=layout)).build(episodes)


def _packed_logprobs(model, recs, temperature: float = 1.0) -> torch.Tensor:
    """Each sequence's log-probs, run alone, laid end to end as a packed batch's ``[1, T]`` row."""
    with torch.no_grad():
        parts = [token_logprobs(model(input_ids=r.ids[None]).logits / temperature, r.ids[None]) for r in recs]
    return torch.cat(parts, dim=1)


def _cfg(**kw):
    base = dict(lr=1e-2, lora=LoraConfig(r=4, alpha=8))
    base.update(kw)
    return TrainConfig(**base)


def test_one_step_changes_lora_not_base():
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    base_before = {k: v.detach().clone() for k, v in model.named_parameters() if "lora_" not in k}
    lora_before = adapter_state(model)
    metrics = PolicyUpdater(model, _cfg()).update(_build(make_episodes(), "packed"))
    lora_after = adapter_state(model)
    assert any(not torch.equal(lora_before[k], lora_after[k]) for k in lora_before)
    for k, v in model.named_parameters():
        if "lora_" not in k:
            assert torch.equal(v, base_before[k]), k
    assert metrics["train/grad_norm"] > 0
    assert 0.0 <= metrics["train/clip_frac"] <= 1.0
    assert metrics["train/entropy"] > 0


def test_no_policy_gradient_leaves_the_adapter_to_the_other_terms():
    """``advantage: none`` (the imitation-only ablation): the fresh batch's rewards move nothing; with the same
    batch ``grpo`` does (test above), so only the replay and KL terms can train."""
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    before = adapter_state(model)
    metrics = PolicyUpdater(model, _cfg(advantage="none")).update(_build(make_episodes(), "packed"))
    after = adapter_state(model)
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert metrics["train/adv_abs_mean"] == 0.0 and metrics["train/grad_norm"] == 0.0


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_rollout_logprobs_match_training_forward(temperature):
    """Token-in/token-out: if the rollout log-probs are the model's own (sampled at ``temperature``), the update
    sees no mismatch; scoring a T=2 rollout under the raw logits would."""
    model = tiny_llama().eval()
    eps = make_episodes(n_groups=1, n_per_group=3)
    batch = _build(eps, "packed")
    recs = seq_records(batch, torch.zeros(batch.num_steps), torch.ones(batch.num_steps))
    lp = _packed_logprobs(model, recs, temperature)
    cu = batch.cu_seqlens
    batch.old_log_probs = (lp * (batch.response_mask > 0)).float()
    assert cu[-1] == lp.shape[1]
    model = attach_lora(model, LoraConfig(r=2, alpha=4))
    metrics = PolicyUpdater(copy.deepcopy(model), _cfg(), temperature=temperature).update(
        copy.deepcopy(batch)
    )
    assert metrics["train/rollout_logp_abs_diff"] < 1e-5
    if temperature != 1.0:  # the same untouched model, scored under the raw logits instead
        untempered = PolicyUpdater(model, _cfg()).update(batch)
        assert untempered["train/rollout_logp_abs_diff"] > 1e-2


def test_rollback_spliced_tokens_use_log_probs_under_the_final_context():
    """A repaired call was sampled with the error in context: its rollout log-probs (here wildly off) must neither
    enter the importance ratio nor count as rollout/training mismatch; the tokens themselves still train."""
    import dataclasses

    from memrl.types import RollbackRecord

    model = tiny_llama().eval()
    eps = make_episodes(n_groups=1, n_per_group=3)
    rb = RollbackRecord(
        position=0, error="NameError", attempts=1, tokens_removed=9, repaired=True, repaired_tokens=2
    )
    eps = [
        dataclasses.replace(
            e,
            steps=(
                dataclasses.replace(e.steps[0], meta=dataclasses.replace(e.steps[0].meta, rollbacks=(rb,))),
            ),
        )
        for e in eps
    ]
    batch = _build(eps, "packed")
    recs = seq_records(batch, torch.zeros(batch.num_steps), torch.ones(batch.num_steps))
    assert all(torch.isnan(r.old_logp[r.prompt_len : r.prompt_len + 2]).all() for r in recs)
    assert not any(torch.isnan(r.old_logp[r.prompt_len + 2 :]).any() for r in recs)
    lp = _packed_logprobs(model, recs)
    batch.old_log_probs = (lp * (batch.response_mask > 0)).float()
    cu = batch.cu_seqlens.tolist()
    for i in range(batch.num_steps):
        start = cu[i] + int(batch.prompt_lengths[i])
        batch.old_log_probs[0, start : start + 2] = -30.0  # sampled under the feedback context
    model = attach_lora(model, LoraConfig(r=2, alpha=4))
    one = PolicyUpdater(copy.deepcopy(model), _cfg(), temperature=1.0).update(copy.deepcopy(batch))
    assert one["train/rollout_logp_abs_diff"] < 1e-5  # the only off values are the spliced ones: not counted
    two = PolicyUpdater(copy.deepcopy(model), _cfg(ppo_epochs=2), temperature=1.0).update(
        copy.deepcopy(batch)
    )
    # -30 in the ratio would give |approx_kl| ~ 10 on these rows; under the final context it stays ~0.
    assert abs(two["train/approx_kl"]) < 0.5 and all(map(math.isfinite, two.values()))
    # The spliced tokens are trained: their loss mask is 1 where the model wrote them.
    assert all(r.loss_mask[r.prompt_len : r.prompt_len + 2].sum() > 0 for r in recs)


def test_recomputed_old_logprobs_are_those_of_each_sequence_run_alone():
    """Several updates per batch recompute the behaviour log-probs through shared-prefix micro-batches, which
    cover only each sequence's tail: they must land on the sequence's own response tokens."""
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    batch = _build(make_episodes(shared_prompt=True), "packed")
    recs = seq_records(batch, torch.zeros(batch.num_steps), torch.ones(batch.num_steps))
    PolicyUpdater(model, _cfg(ppo_epochs=2, micro_batch_size=3))._recompute_old_logp(recs)
    alone, cu = _packed_logprobs(model.eval(), recs)[0], batch.cu_seqlens.tolist()
    for i, rec in enumerate(recs):
        pl = rec.prompt_len
        assert rec.old_logp.shape == rec.ids.shape and not rec.old_logp[:pl].any()  # prompt: no log-prob
        assert torch.allclose(rec.old_logp[pl:], alone[cu[i] + pl : cu[i + 1]], atol=1e-5), i


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batch_accumulation_equals_one_big_batch(agg):
    eps = make_episodes(shared_prompt=True)
    grads = []
    for micro_batch_size in (None, 3, 1):  # None: every row in one padded micro-batch, no prefix sharing
        model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
        torch.manual_seed(1)
        for name, p in model.named_parameters():  # non-zero B so the gradient of A is non-trivial
            if "lora_B" in name:
                p.data.normal_(0, 0.1)
        upd = PolicyUpdater(
            model,
            _cfg(
                loss_agg=agg,
                micro_batch_size=micro_batch_size or 8,
                max_grad_norm=1e9,
            ),
        )
        if micro_batch_size is None:
            upd._micro = lambda records: [collate(records)]
        upd.optimizer.step = lambda: None  # inspect the accumulated gradient, do not apply it
        upd.optimizer.zero_grad = lambda set_to_none=True: None
        upd.update(_build(eps, "packed"))
        grads.append(torch.cat([p.grad.flatten() for p in upd.params]))
    assert grads[0].abs().sum() > 0
    # 2 groups of 4 in chunks of 3 and of 1: gradients accumulate, and flow through the shared prompt's cache
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)
    assert torch.allclose(grads[0], grads[2], atol=1e-6, rtol=1e-4)


def test_kl_reference_is_adapter_disabled_and_zero_at_start():
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    upd = PolicyUpdater(model, _cfg(kl_coef=0.1))
    batch = _build(make_episodes(), "padded")
    first = upd.update(batch)
    assert first["train/kl_ref"] < 1e-7  # lora_B starts at 0: policy == reference
    # several optimizer steps per batch: old log-probs are recomputed, the policy drifts from the reference
    second = PolicyUpdater(model, _cfg(kl_coef=0.1, ppo_mini_batches=2, ppo_epochs=2)).update(batch)
    assert second["train/kl_ref"] > 1e-7
    assert second["train/approx_kl"] != 0
    # The step profile: every phase that ran is timed; the first update had one on-policy pass (no old log-probs).
    assert all(first[f"time/{k}_s"] > 0 for k in ("policy_forward_backward", "ref_logprob", "optimizer"))
    assert "time/old_logprob_s" not in first and second["time/old_logprob_s"] > 0


def _anchored_cfg(**kw):
    return _cfg(kl_coef=0.1, kl_reference="warm_start", warm_start=WarmStartConfig(episodes=1), **kw)


def test_an_anchored_reference_is_the_saved_adapter_and_the_weights_stay_the_policys(tmp_path):
    """train.kl_reference=warm_start: the KL is taken to the adapter saved in the directory, not to the model
    without adapter; the reference pass swaps its weights in and the policy's back (same update as the base
    reference when the saved adapter is the untrained one)."""
    batch = _build(make_episodes(), "padded")
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    save_adapter(model, tmp_path / "untrained")
    PolicyUpdater(model, _cfg()).update(batch)  # the policy moves off the untrained adapter
    save_adapter(model, tmp_path / "trained")
    twin = copy.deepcopy(model)
    before = adapter_state(model)

    upd = PolicyUpdater(model, _anchored_cfg())
    upd.anchor_reference(tmp_path / "trained")
    assert all(
        torch.equal(before[k], v) for k, v in adapter_state(model).items()
    )  # reading leaves the policy
    anchored = upd.update(batch)
    assert anchored["train/kl_ref"] < 1e-7  # the policy is the anchored adapter
    assert PolicyUpdater(copy.deepcopy(twin), _cfg(kl_coef=0.1)).update(batch)["train/kl_ref"] > 1e-5

    # Anchored on the untrained adapter = the base reference: same KL, same new weights.
    base_model, anchored_model = copy.deepcopy(twin), copy.deepcopy(twin)
    base = PolicyUpdater(base_model, _cfg(kl_coef=0.1)).update(batch)
    upd = PolicyUpdater(anchored_model, _anchored_cfg())
    upd.anchor_reference(tmp_path / "untrained")
    same = upd.update(batch)
    assert same["train/kl_ref"] == pytest.approx(base["train/kl_ref"], rel=1e-4)
    a, b = adapter_state(base_model), adapter_state(anchored_model)
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert not all(torch.allclose(a[k], before[k]) for k in a)  # and the update did move the weights


def test_an_anchored_reference_needs_a_warm_start_and_a_kl():
    with pytest.raises(ValueError, match="kl_reference: warm_start needs"):
        _cfg(kl_coef=0.0, kl_reference="warm_start", warm_start=WarmStartConfig(episodes=1))
    with pytest.raises(ValueError, match="kl_reference: warm_start needs"):
        _cfg(kl_coef=0.1, kl_reference="warm_start")
    with pytest.raises(ValueError, match=r"one of \('base', 'warm_start', 'start'\)"):
        _cfg(kl_reference="initial")
    with pytest.raises(ValueError, match="kl_reference: start needs train.kl_coef > 0"):
        _cfg(kl_reference="start")


def test_duplicate_leaves_get_no_gradient():
    eps = make_episodes(n_groups=1, n_per_group=4, duplicate_last=True)
    batch = _build(eps, "packed")
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    upd = PolicyUpdater(model, _cfg())
    metrics = upd.update(batch)
    assert metrics["train/duplicates"] == 1.0
    recs = seq_records(batch, torch.ones(4), torch.tensor([1.0, 1.0, 1.0, 0.0]))
    assert recs[3].loss_mask.sum() == 0 and recs[0].loss_mask.sum() > 0


def test_rows_of_flat_groups_are_skipped_with_the_gradient_unchanged():
    """Without KL or entropy terms a group whose rewards are all equal has zero advantage everywhere: its rows are
    not forwarded, and the update equals the update on the other groups alone."""
    episodes = [dataclasses.replace(ep, reward=0.5) if ep.group_id == "g1" else ep for ep in make_episodes()]
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    alone = copy.deepcopy(model)
    metrics = PolicyUpdater(model, _cfg()).update(_build(episodes, "padded"))
    PolicyUpdater(alone, _cfg()).update(_build([ep for ep in episodes if ep.group_id == "g0"], "padded"))
    assert metrics["train/sequences_skipped"] == 4.0 and metrics["train/sequences"] == 4.0
    both, only = adapter_state(model), adapter_state(alone)
    assert all(torch.allclose(both[k], only[k], atol=1e-6) for k in both)
    # With a KL term the flat rows still carry gradient (towards the reference): nothing is skipped.
    kl = PolicyUpdater(attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8)), _cfg(kl_coef=0.1))
    assert kl.update(_build(episodes, "padded"))["train/sequences_skipped"] == 0.0


def _as_writes(episodes, group: str):
    """The episodes of ``group`` as memory writes (history steps the policy wrote), the others as answers."""
    out = []
    for ep in episodes:
        if ep.group_id == group:
            meta = StepMeta(
                turn_id="t", turn_role=TurnRole.HISTORY, role=StepRole.MEMORY, write=MemoryWrite(index=0)
            )
            ep = dataclasses.replace(ep, steps=tuple(dataclasses.replace(s, meta=meta) for s in ep.steps))
        out.append(ep)
    return out


def test_per_role_adapters_each_learn_from_their_own_rows_only():
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8), per_role=True)
    episodes = _as_writes(make_episodes(), group="g1")
    updater = PolicyUpdater(model, _cfg())

    def changed(batch_episodes):
        before = {name: adapter_state(model, name) for name in ("default", "memory")}
        updater.update(_build(batch_episodes, "padded"))
        after = {name: adapter_state(model, name) for name in ("default", "memory")}
        return {
            name
            for name in before
            if any(not torch.equal(before[name][k], after[name][k]) for k in before[name])
        }

    assert changed([ep for ep in episodes if ep.group_id == "g1"]) == {"memory"}
    assert changed([ep for ep in episodes if ep.group_id == "g0"]) == {"default"}
    assert changed(episodes) == {"default", "memory"}
    assert model.active_adapter == "default"  # the answer adapter is active again after the update


def test_shared_lora_keeps_every_row_on_one_adapter():
    model = attach_lora(tiny_llama(), LoraConfig(r=4, alpha=8))
    before = adapter_state(model)
    PolicyUpdater(model, _cfg()).update(_build(_as_writes(make_episodes(), group="g1"), "padded"))
    after = adapter_state(model)
    assert set(model.peft_config) == {"default"} and any(not torch.equal(before[k], after[k]) for k in before)
