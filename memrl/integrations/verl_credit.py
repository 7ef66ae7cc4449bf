"""memrl's step credit inside verl's v1 trainer: the ``memrl_step_credit`` advantage estimator and the one hook
that feeds it.

With ``memory.extractor: policy`` one verl sample returns several outputs (its credited memory writes, then the
answer; :mod:`memrl.integrations.verl_rows`), and verl 0.9's v1 trainer makes each one a row. Two verl lines would
train them wrongly, so this module works around both:

* ``verl/trainer/ppo/v1/agent_loop_tq.py`` (``AgentLoopWorkerTQ._agent_loop_postprocess``) copies the last
  output's ``reward_score`` onto the sample's earlier outputs: every write would get the answer's reward. Each row
  keeps its own reward in ``extra_fields["memrl_reward"]``, and the hook writes it back into ``rm_scores``
  before verl reads them;
* ``verl/trainer/ppo/v1/utils.py`` (``compute_advantage_for_multi_trajectories``) computes GRPO advantages of
  each sample's last output only and broadcasts them; for any other estimator it calls
  ``verl.trainer.ppo.ray_trainer.compute_advantage`` unchanged, which calls a registered estimator with the rows'
  ``uid`` as ``index``. So memrl registers its own estimator, ``memrl_step_credit`` (``register_adv_est``), and
  the hook hands it each row's memrl credit group and loss weight instead of the prompt's ``uid``.

The hook wraps one method, ``verl.trainer.ppo.v1.trainer_base.PPOTrainer._compute_advantage`` (step 7 of verl's
``_step_once``): it reads ``extra_fields`` of the batch's rows from TransferQueue; for a batch without memrl
memory rows (answers only, one output per sample, or another agent loop's rows) it calls verl's method unchanged. The estimator computes memrl's advantage per memrl group with memrl's own
functions (:func:`memrl.train.advantages.compute_advantages`, the estimator memrl's ``train.advantage`` names:
``grpo`` / ``drgrpo`` / ``rloo`` / ``none``), so verl's update trains exactly what ``memrl train`` trains, and adds
``memory/*`` and ``answer/*`` row counts, rewards and advantages to verl's step metrics.

Load it in every verl process that computes advantages: ``actor_rollout_ref.model.external_lib=
memrl.integrations.verl_credit`` (verl imports it when it builds the model config, in the trainer too). Importing
it checks that the verl lines above read as in verl 0.9.1 (:func:`check_verl_lines`) and raises
:class:`VerlVersionError` naming the file and line where they do not.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from memrl.integrations.verl_rows import (
    ANSWER,
    CREDIT_MODULE,
    ESTIMATOR,
    GROUP_KEY,
    MEMORY,
    REWARD_KEY,
    ROLE_KEY,
    WEIGHT_KEY,
)
from memrl.train.advantages import ADVANTAGES, compute_advantages, token_advantages

MODULE = CREDIT_MODULE
TESTED_VERL = "0.9.1"

# (module, function or Class.method, lines it must contain): what memrl relies on, by verl file.
VERL_LINES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "verl.trainer.ppo.v1.agent_loop_tq",
        "AgentLoopWorkerTQ._agent_loop_postprocess",
        (
            "outputs = output if isinstance(output, list) else [output]",
            "output.reward_score = final_output.reward_score",
            'output.extra_fields["reward_extra_info"] = final_output.extra_fields["reward_extra_info"]',
            'keys.append(f"{uid}_{session_id}_{i}")',
        ),
    ),
    (
        "verl.trainer.ppo.v1.utils",
        "compute_advantage_for_multi_trajectories",
        ("if adv_estimator != core_algos.AdvantageEstimator.GRPO:", "return compute_advantage("),
    ),
    (
        "verl.trainer.ppo.ray_trainer",
        "compute_advantage",
        (
            "adv_estimator_fn = core_algos.get_adv_estimator_fn(adv_estimator)",
            'adv_kwargs["index"] = data.non_tensor_batch["uid"]',
            "advantages, returns = adv_estimator_fn(**adv_kwargs)",
        ),
    ),
    (
        "verl.trainer.ppo.v1.trainer_base",
        "PPOTrainer._compute_advantage",
        (
            '"rm_scores"',
            'data.batch["token_level_scores"] = data.batch["rm_scores"]',
            "data = compute_advantage_for_multi_trajectories(",
        ),
    ),
)


class VerlVersionError(RuntimeError):
    """The installed verl no longer reads as the lines memrl's step credit depends on."""


class VerlCreditError(ValueError):
    """A batch holds memrl rows that verl would train wrongly (the message names the setting to change)."""


def _source(module: str, qualname: str) -> str:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
        # a Ray actor class keeps its Python class behind the handle
        obj = getattr(getattr(obj, "__ray_metadata__", None), "modified_class", obj)
    return inspect.getsource(obj)


def check_verl_lines() -> None:
    """Raise :class:`VerlVersionError` where verl's code differs from the lines memrl depends on (docs/verl.md)."""
    import verl

    for module, qualname, lines in VERL_LINES:
        try:
            text = _source(module, qualname)
        except (ImportError, AttributeError, OSError, TypeError) as exc:
            raise VerlVersionError(
                f"verl {verl.__version__}: {module}.{qualname} is gone ({exc}); memrl's step credit was written "
                f"against verl {TESTED_VERL} (docs/verl.md, 'verl lines memrl depends on')"
            ) from exc
        missing = [line for line in lines if line not in text]
        if missing:
            raise VerlVersionError(
                f"verl {verl.__version__}: {module}.{qualname} no longer contains {missing[0]!r}; memrl's step "
                f"credit relies on it (written against verl {TESTED_VERL}; docs/verl.md, 'verl lines memrl "
                "depends on'). Pin verl==0.9.1 or update memrl.integrations.verl_credit"
            )


@dataclass
class RowCredit:
    """What the hook reads for one batch: per row, its memrl role, credit group, reward and loss weight; the
    estimator fills ``metrics``."""

    roles: list[str | None]
    groups: list[str | None]
    rewards: list[float | None]
    weights: list[float]
    advantage: str = "grpo"  # memrl's train.advantage
    metrics: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_extra_fields(cls, extra_fields: Sequence[Any], advantage: str = "grpo") -> RowCredit | None:
        """``None`` when no row is memrl's (another agent loop's batch: verl runs unchanged)."""
        dicts = [e if isinstance(e, dict) else {} for e in extra_fields]
        if not any(GROUP_KEY in e for e in dicts):
            return None
        if advantage not in ADVANTAGES:
            raise VerlCreditError(
                f"memrl train.advantage={advantage!r}: expected one of {ADVANTAGES.names()}"
            )
        return cls(
            roles=[e.get(ROLE_KEY) for e in dicts],
            groups=[e.get(GROUP_KEY) for e in dicts],
            rewards=[None if e.get(REWARD_KEY) is None else float(e[REWARD_KEY]) for e in dicts],
            weights=[float(e.get(WEIGHT_KEY, 1.0)) for e in dicts],
            advantage=advantage,
        )


_ROWS: contextvars.ContextVar[RowCredit | None] = contextvars.ContextVar("memrl_row_credit", default=None)


@contextlib.contextmanager
def rows_credited(credit: RowCredit) -> Iterator[RowCredit]:
    """``memrl_step_credit`` calls inside read ``credit``'s groups and weights (one batch's rows, in order)."""
    token = _ROWS.set(credit)
    try:
        yield credit
    finally:
        _ROWS.reset(token)


def memrl_advantage(verl_config: Any) -> str:
    """memrl's ``train.advantage`` from verl's ``memrl`` section (``config`` / ``overrides``), as the agent loop
    reads its config: the estimator ``memrl train`` would use (``grpo``, ``drgrpo``, ``rloo``, ``none``)."""
    from memrl.config import load_config

    section = verl_config.get("memrl", None) or {}
    key = (section.get("config", None), tuple(section.get("overrides", None) or ()))
    if key not in _ADVANTAGE:
        _ADVANTAGE[key] = load_config(key[0], list(key[1])).train.advantage
    return _ADVANTAGE[key]


_ADVANTAGE: dict[tuple, str] = {}


def memrl_step_credit(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: Sequence[Any] | None = None,
    config: Any = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's estimator signature: ``[B, T]`` rewards and mask → ``[B, T]`` advantages and returns.

    Groups: each row's memrl credit group where the hook set them for this batch (:class:`RowCredit`), else
    ``index`` (verl's ``uid``: plain GRPO over the prompt's samples). Scores: each row's reward (the sum of its
    token rewards; verl puts it on the last token). Advantages: memrl's estimator (memrl's ``train.advantage``,
    read by the hook; ``grpo`` without it) over counted rows (weight 1), broadcast over the row's response
    tokens; a row of weight 0 (a tree's duplicate leaf) gets 0."""
    credit = _ROWS.get()
    rows = token_level_rewards.shape[0]
    if credit is not None:
        groups = [g if g is not None else f"row{i}" for i, g in enumerate(credit.groups)]
        weights = torch.tensor(credit.weights, dtype=torch.float32)
    elif index is not None:
        groups, weights = [str(g) for g in index], torch.ones(rows)
    else:
        raise VerlCreditError("memrl_step_credit needs the rows' groups: verl passed no uid index")
    if len(groups) != rows:
        raise VerlCreditError(f"memrl_step_credit: {len(groups)} groups for {rows} rows")
    scores = token_level_rewards.sum(-1).float()
    name = credit.advantage if credit is not None else "grpo"
    adv = compute_advantages(name, scores, groups, weights) * weights
    if credit is not None:
        credit.metrics = role_metrics(credit.roles, scores, adv, weights)
    tokens = token_advantages(adv, response_mask.float())
    return tokens, tokens


def role_metrics(
    roles: Sequence[str | None], scores: torch.Tensor, adv: torch.Tensor, weights: torch.Tensor
) -> dict[str, float]:
    """``<role>/rows``, ``/reward_mean``, ``/adv_mean``, ``/adv_abs_mean`` per role, as ``memrl train`` logs
    them (:func:`memrl.train.roles.role_metrics`)."""
    out: dict[str, float] = {}
    for role in (ANSWER, MEMORY):
        idx = [i for i, r in enumerate(roles) if r == role and weights[i] > 0]
        if idx:
            s, a = scores[idx], adv[idx]
            out.update(
                {
                    f"{role}/rows": float(len(idx)),
                    f"{role}/reward_mean": float(s.mean()),
                    f"{role}/adv_mean": float(a.mean()),
                    f"{role}/adv_abs_mean": float(a.abs().mean()),
                }
            )
    return out


def restored_scores(rm_scores: Sequence[torch.Tensor], credit: RowCredit) -> list[torch.Tensor]:
    """Each row's ``rm_scores`` with its own memrl reward on its last token (undoing verl's copy of the sample's
    last reward onto its earlier outputs); rows without a memrl reward are kept as they are."""
    out = []
    for scores, reward in zip(rm_scores, credit.rewards, strict=True):
        if reward is None or scores.numel() == 0:
            out.append(scores)
            continue
        fixed = torch.zeros_like(scores)
        fixed[-1] = reward
        out.append(fixed)
    return out


def _as_list(values: Any) -> list[Any]:
    """A TransferQueue non-tensor column as a list (a ``NonTensorStack`` or tensordict's ``LinkedList``)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


def _credit_compute_advantage(original):
    def _compute_advantage(self, batch, metrics):
        import transfer_queue as tq
        from tensordict import TensorDict

        got = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields", "rm_scores"]
        )
        credit = RowCredit.from_extra_fields(_as_list(got["extra_fields"]), memrl_advantage(self.config))
        if credit is None or MEMORY not in credit.roles:
            # one output per sample (answers only, or another agent loop): verl's own advantage is memrl's
            return original(self, batch, metrics)
        estimator = self.config.algorithm.adv_estimator
        if estimator != ESTIMATOR:
            raise VerlCreditError(
                f"algorithm.adv_estimator={estimator!r} with memrl's memory rows: verl would give every row of a "
                f"sample its last output's advantage; set algorithm.adv_estimator={ESTIMATOR}"
            )
        scores = restored_scores(list(got["rm_scores"].unbind()), credit)
        nested = torch.nested.as_nested_tensor(scores, layout=torch.jagged)
        tq.kv_batch_put(
            keys=batch.keys,
            partition_id=batch.partition_id,
            fields=TensorDict({"rm_scores": nested}, batch_size=len(batch.keys)),
        )
        with rows_credited(credit):
            out = original(self, batch, metrics)
        metrics.update(credit.metrics)
        return out

    _compute_advantage.memrl_hook = True  # type: ignore[attr-defined]
    _compute_advantage.__wrapped__ = original  # type: ignore[attr-defined]
    return _compute_advantage


def install() -> None:
    """Register ``memrl_step_credit`` with verl and wrap ``PPOTrainer._compute_advantage`` (once per process)."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    check_verl_lines()
    if ADV_ESTIMATOR_REGISTRY.get(ESTIMATOR) is not memrl_step_credit:
        register_adv_est(ESTIMATOR)(memrl_step_credit)
    if not getattr(PPOTrainer._compute_advantage, "memrl_hook", False):
        PPOTrainer._compute_advantage = _credit_compute_advantage(PPOTrainer._compute_advantage)


install()
