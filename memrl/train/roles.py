"""The two roles one policy plays: ``answer`` (target-turn steps) and ``memory`` (its own memory writes).

``train.roles`` names the roles the policy gradient trains; ``train.role_schedule: alternate`` trains one role
at a time in phases of ``train.role_phase_steps`` steps, in the order of ``train.roles``, while the other is
frozen (its rows leave the batch; the policy still plays it), as Memory-R1 trains its memory manager against a
frozen answer agent and the answer agent against a fixed memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from memrl.train.config import TrainConfig
from memrl.train.lora import MEMORY_ADAPTER, adapter_for
from memrl.types import EpisodeTrajectory, StepMeta, StepTrajectory


def step_role(meta: StepMeta) -> str | None:
    """``answer`` for a target step, ``memory`` for a policy-written memory step, ``None`` otherwise."""
    return None if meta.role is None else meta.role.value


def label_adapters(records: Sequence, step_meta: Sequence[StepMeta] | None, model: torch.nn.Module) -> None:
    """Set each :class:`~memrl.train.microbatch.SeqRecord`'s ``adapter`` to the one that plays its step's role
    (a shared LoRA leaves every record on the default adapter)."""
    if not step_meta or MEMORY_ADAPTER not in getattr(model, "peft_config", {}):
        return
    for rec in records:
        rec.adapter = adapter_for(model, step_role(step_meta[rec.index]))


def active_roles(cfg: TrainConfig, step: int) -> list[str]:
    """The roles trained at ``step`` (1-based)."""
    if cfg.role_schedule == "joint" or len(cfg.roles) == 1:
        return list(cfg.roles)
    phase = (step - 1) // cfg.role_phase_steps
    return [cfg.roles[phase % len(cfg.roles)]]


def keep_roles(episodes: Sequence[EpisodeTrajectory], roles: Sequence[str]) -> list[EpisodeTrajectory]:
    """Episodes with the trainable steps of other roles removed; an episode left with none is dropped."""
    out = []
    for ep in episodes:
        ext = ep.step_rewards_ext or (None,) * len(ep.steps)
        kept: list[tuple[StepTrajectory, float | None]] = [
            (s, r)
            for s, r in zip(ep.steps, ext, strict=True)
            if step_role(s.meta) in roles or not s.trainable
        ]
        if any(s.trainable for s, _ in kept):
            out.append(
                dataclasses.replace(
                    ep,
                    steps=tuple(s for s, _ in kept),
                    step_rewards_ext=tuple(r for _, r in kept) if ep.step_rewards_ext else (),
                )
            )
    return out


def role_metrics(
    step_meta: Sequence[StepMeta], scores: torch.Tensor, adv: torch.Tensor, weights: torch.Tensor
) -> dict[str, float]:
    """``<role>/reward_mean``, ``<role>/adv_mean``, ``<role>/adv_abs_mean`` and ``<role>/rows`` per role present."""
    out: dict[str, float] = {}
    roles = [step_role(m) for m in step_meta]
    for role in ("answer", "memory"):
        idx = [i for i, r in enumerate(roles) if r == role and weights[i] > 0]
        if not idx:
            continue
        s, a = scores[idx], adv[idx]
        out.update(
            {
                f"{role}/reward_mean": float(s.mean()),
                f"{role}/adv_mean": float(a.mean()),
                f"{role}/adv_abs_mean": float(a.abs().mean()),
                f"{role}/rows": float(len(idx)),
            }
        )
    return out


def memory_rollout_metrics(episodes: Sequence[EpisodeTrajectory]) -> dict[str, float]:
    """The writes of a rollout (applied replies only): ``memory/credit_mean``, ``memory/format_ok``,
    ``memory/op_right`` and ``memory/op_score`` (where the dataset knows the operations) and ``memory/steps``."""
    applied = [
        (s, r)
        for ep in episodes
        for s, r in zip(ep.steps, ep.step_rewards_ext or (None,) * len(ep.steps), strict=True)
        if s.meta.write is not None and s.meta.write.applied
    ]
    if not applied:
        return {}
    writes = [s.meta.write for s, _ in applied]
    credits = [r for _, r in applied if r is not None]
    known = [w.op_right for w in writes if w.op_right is not None]
    out = {
        "memory/steps": float(len(applied)),
        "memory/format_ok": sum(not w.format_errors for w in writes) / len(applied),
    }
    if credits:
        out["memory/credit_mean"] = sum(credits) / len(credits)
    if known:
        out["memory/op_right"] = sum(map(float, known)) / len(known)
    scores = [w.op_score for w in writes if w.op_score is not None]
    if scores:
        out["memory/op_score"] = sum(scores) / len(scores)
    return out
