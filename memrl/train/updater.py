"""One GRPO update of a LoRA policy on a :class:`~memrl.types.PackedBatch`.

    updater = PolicyUpdater(peft_model, cfg.train, temperature=cfg.rollout.temperature)
    metrics = updater.update(batch)                  # advantages → mini-batches → micro-batches → AdamW steps
    metrics = updater.update(batch, replay=sample)   # + SFT/RFT on replayed episodes

Per batch: sequence advantages from the group rewards (:mod:`memrl.train.advantages`), then ``ppo_epochs`` passes
over ``ppo_mini_batches`` mini-batches; each mini-batch is one optimizer step accumulated over micro-batches.
With a single optimizer step per batch the update is exactly on-policy, so the "old" log-probs are the current
ones (detached) and ρ = 1; with several, the old log-probs are recomputed once before the first step, as verl's
actor does. The rollout's own log-probs are only compared against (``train/rollout_logp_abs_diff``): that is the
check that training sees exactly the tokens inference produced. Log-probs are taken under ``logits / temperature``
(the rollout's sampling temperature, as verl's actor does), so a policy sampled at T != 1 is trained on the
distribution it actually sampled from, and the PPO ratio starts at exactly 1.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Sequence

import torch

from memrl.train.advantages import compute_advantages, sample_weights, signal_weights
from memrl.train.config import TrainConfig
from memrl.train.lora import lora_swapped, saved_lora_tensors, trainable_parameters, use_adapter
from memrl.train.losses import LOSS_AGGREGATIONS, clipped_policy_loss, kl_to_reference, masked_mean
from memrl.train.microbatch import (
    MicroBatch,
    SeqRecord,
    forward_logits,
    model_device,
    seq_records,
    split_micro_batches,
    token_entropy,
    token_logprobs,
)
from memrl.train.roles import label_adapters, role_metrics
from memrl.train.tree_advantages import tree_local_advantages
from memrl.types import PackedBatch


class PolicyUpdater:
    """Holds the optimizer of a PEFT model's trainable (adapter) parameters and applies GRPO updates."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig, temperature: float = 1.0) -> None:
        if temperature < 0:
            raise ValueError(
                f"PolicyUpdater: temperature must be >= 0 (0 = greedy rollouts), got {temperature}"
            )
        self.model = model
        self.cfg = cfg
        # Greedy rollouts have no sampling distribution; score them under the raw logits.
        self.temperature = temperature if temperature > 0 else 1.0
        self.agg = LOSS_AGGREGATIONS.get(cfg.loss_agg)
        self.params = trainable_parameters(model)
        self._times: dict[str, float] = defaultdict(float)
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay
        )
        # The KL's reference adapter weights (train.kl_reference: warm_start); None = the adapter switched off.
        self._reference: dict[str, torch.Tensor] | None = None

    def anchor_reference(self, adapter_dir) -> None:
        """Make the adapter saved in ``adapter_dir`` (the warm start's) the KL's reference policy, instead of the
        model without adapter: RL then pays for moving away from what imitation taught, not for having learned
        it (a base model that never calls a tool is no useful reference for a policy that must)."""
        self._reference = saved_lora_tensors(self.model, adapter_dir)

    # ------------------------------------------------------------------ public
    def update(self, batch: PackedBatch, replay=None) -> dict[str, float]:
        """Apply the update for one batch; returns namespaced scalar metrics (``train/...``)."""
        weights = sample_weights(batch.step_meta)
        scores = torch.as_tensor(batch.rewards, dtype=torch.float32).flatten()
        adv = compute_advantages(self.cfg.advantage, scores, batch.group_ids, weights)
        cfg = self.cfg
        if cfg.kl_coef == 0 and cfg.entropy_coef == 0 and cfg.tree_local_weight <= 0:
            weights = weights * signal_weights(scores, batch.group_ids, weights)
        records = seq_records(batch, adv, weights)
        label_adapters(records, batch.step_meta, self.model)
        local_abs = self._add_tree_local(batch, scores, weights, records)
        # Rows without a counted token (flat groups above, dropped duplicates) add nothing: not forwarded.
        n_rows = len(records)
        records = [r for r in records if bool(r.loss_mask.any())]
        n_updates = self.cfg.ppo_epochs * self.cfg.ppo_mini_batches
        self._times = defaultdict(float)
        if n_updates > 1:
            with self._timed("old_logprob"):
                self._recompute_old_logp(records)
        sums: dict[str, list[float]] = defaultdict(list)
        self.model.train()
        for epoch in range(self.cfg.ppo_epochs):
            for k, mini in enumerate(self._mini_batches(records) or [[]]):  # replay still trains
                extra = replay if (epoch == 0 and k == 0) else None
                for name, value in self._optimizer_step(mini, on_policy=n_updates == 1, replay=extra).items():
                    sums[name].append(value)
        metrics = {name: sum(v) / len(v) for name, v in sums.items()}
        metrics.update(
            {
                "train/adv_mean": float((adv * weights).sum() / weights.sum().clamp(min=1)),
                "train/adv_abs_mean": float((adv.abs() * weights).sum() / weights.sum().clamp(min=1)),
                "train/reward_mean": float(scores.mean()) if len(scores) else 0.0,
                "train/duplicates": float((weights == 0).sum()),
                "train/tree_local_abs_mean": local_abs,
                "train/sequences": float(len(records)),
                "train/sequences_skipped": float(n_rows - len(records)),
            }
        )
        metrics.update(role_metrics(batch.step_meta, scores, adv, weights))
        # Where an update's time goes (the step profile): reference / old log-probs, policy forward+backward,
        # replay loss, optimizer step.
        metrics.update({f"time/{name}_s": value for name, value in self._times.items()})
        return metrics

    @contextlib.contextmanager
    def _timed(self, name: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._times[name] += time.perf_counter() - t0

    # ------------------------------------------------------------------ internals
    def _add_tree_local(self, batch: PackedBatch, scores, weights, records: list[SeqRecord]) -> float:
        """Add ``tree_local_weight`` × the tree-local advantage to each tree leaf's response tokens; returns
        the mean |local advantage| over counted response tokens (0 when off or without tree leaves)."""
        w = self.cfg.tree_local_weight
        if w <= 0:
            return 0.0
        lengths = [len(r.ids) - r.prompt_len for r in records]
        local = tree_local_advantages(batch.step_meta, scores, batch.group_ids, weights, lengths)
        total, count = 0.0, 0.0
        for rec, extra in zip(records, local, strict=True):
            if extra is None:
                continue
            rec.adv[rec.prompt_len :] += w * extra
            mask = rec.loss_mask[rec.prompt_len :]
            total += float((extra.abs() * mask).sum())
            count += float(mask.sum())
        return total / count if count else 0.0

    def _mini_batches(self, records: Sequence[SeqRecord]) -> list[list[SeqRecord]]:
        if not records:
            return []
        n = self.cfg.ppo_mini_batches
        size = -(-len(records) // n)
        return [list(records[i : i + size]) for i in range(0, len(records), size)]

    def _micro(self, records: Sequence[SeqRecord]) -> list[MicroBatch]:
        device = model_device(self.model)
        return [mb.to(device) for mb in split_micro_batches(records, self.cfg.micro_batch_size)]

    @torch.no_grad()
    def _recompute_old_logp(self, records: list[SeqRecord]) -> None:
        self.model.eval()
        by_row = {r.index: r for r in records}
        for mb in self._micro(records):
            with use_adapter(self.model, mb.adapter):
                logp = token_logprobs(self._logits(mb), mb.input_ids)
            for k, row in enumerate(mb.rows):
                rec = by_row[row]
                # A micro-batch covers a sequence's tail only (its shared prompt minus the last token ran once
                # before it); the prompt part keeps its zeros.
                covered = logp[mb.seq_index == k].cpu()
                rec.old_logp = torch.cat([rec.old_logp[: len(rec.ids) - len(covered)], covered])
        self.model.train()

    def _optimizer_step(self, records: list[SeqRecord], on_policy: bool, replay) -> dict[str, float]:
        micro = self._micro(records)
        total = sum(self.agg.count(mb.loss_mask, mb.seq_index) for mb in micro)
        metrics: dict[str, list[float]] = defaultdict(list)
        for mb in micro:
            with use_adapter(self.model, mb.adapter):  # through the backward: PEFT trains the active adapter
                step_metrics = self._micro_step(mb, max(total, 1.0), on_policy)
            for name, value in step_metrics.items():
                metrics[name].append(value)
        if replay is not None:
            from memrl.train.replay import replay_loss

            with self._timed("replay"):
                _, rmetrics = replay_loss(self.model, replay, self.cfg)  # backpropagates per micro-batch
            for name, value in rmetrics.items():
                metrics[name].append(value)
        with self._timed("optimizer"):
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        out = {name: sum(v) / len(v) for name, v in metrics.items()}
        out["train/grad_norm"] = float(grad_norm)
        return out

    def _micro_step(self, mb: MicroBatch, normaliser: float, on_policy: bool) -> dict[str, float]:
        cfg = self.cfg
        t0 = time.perf_counter()
        ref = None
        if cfg.kl_coef > 0:  # before the policy's forward: a swapped-in reference must not touch its graph
            with self._timed("ref_logprob"):
                ref = self._reference_logp(mb)
            t0 = time.perf_counter()  # the policy's clock excludes the reference pass
        logits = self._logits(mb)
        logp = token_logprobs(logits, mb.input_ids)
        # One update per batch is on-policy (old = current); several recompute old_logp first: either way the
        # ratio's old log-probs are under the final context, also on rollback-spliced tokens (NaN in the batch).
        old = logp.detach() if on_policy else mb.old_logp
        tok_loss, pg = clipped_policy_loss(
            logp, old, mb.adv, mb.loss_mask, cfg.clip_ratio_low, cfg.clip_ratio_high
        )
        width = mb.input_ids.shape[1]
        entropy = token_entropy(logits, width) if cfg.entropy_coef > 0 else None
        with torch.no_grad():
            ent_metric = entropy.detach() if entropy is not None else token_entropy(logits, width)
        if entropy is not None:
            tok_loss = tok_loss - cfg.entropy_coef * entropy
        kl = None
        if ref is not None:
            kl = kl_to_reference(logp, ref)
            tok_loss = tok_loss + cfg.kl_coef * kl
        loss = (tok_loss * self.agg.weights(mb.loss_mask, mb.seq_index)).sum() / normaliser
        loss.backward()
        self._times["policy_forward_backward"] += time.perf_counter() - t0
        out = {
            "train/pg_loss": float(loss.detach()),
            "train/clip_frac": float(pg["clip_frac"]),
            "train/approx_kl": float(pg["approx_kl"]),
            "train/entropy": float(masked_mean(ent_metric, mb.loss_mask)),
            # Rollout vs training log-probs on tokens that have a rollout log-prob (not rollback-spliced ones).
            "train/rollout_logp_abs_diff": float(
                masked_mean(
                    (logp.detach() - mb.old_logp.nan_to_num()).abs(), mb.loss_mask * ~mb.old_logp.isnan()
                )
            ),
        }
        if kl is not None:
            out["train/kl_ref"] = float(masked_mean(kl.detach(), mb.loss_mask))
        return out

    @torch.no_grad()
    def _reference_logp(self, mb: MicroBatch) -> torch.Tensor:
        """Reference policy = the same module with the LoRA adapter switched off (no second model copy), or with
        the anchored adapter's weights swapped in (:meth:`anchor_reference`)."""
        if self._reference is not None:
            ctx = lora_swapped(self.model, self._reference)
        elif hasattr(self.model, "disable_adapter"):
            ctx = self.model.disable_adapter()
        else:
            ctx = contextlib.nullcontext()
        with ctx:
            return token_logprobs(self._logits(mb), mb.input_ids)

    def _logits(self, mb: MicroBatch) -> torch.Tensor:
        logits = forward_logits(self.model, mb)
        return logits / self.temperature if self.temperature != 1.0 else logits
