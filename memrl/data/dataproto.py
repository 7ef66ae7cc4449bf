"""The verl hook: :class:`PackedBatch` → verl ``DataProto`` with the field names verl's agent loop emits.

Tensors (padded layout, ``[N, ·]``; a packed batch is re-laid out first because verl removes padding itself):

=======================  ================================================================================
``prompts``              ``[N, P]`` left-padded prompt ids
``responses``            ``[N, R]`` right-padded response ids
``response_mask``        ``[N, R]`` 1 on policy tokens, 0 on tool output / injected text / padding
``input_ids``            ``[N, P + R]``; ``attention_mask`` / ``position_ids`` likewise
``rollout_log_probs``    ``[N, R]`` behaviour-policy log-probs (agent-loop name)
``old_log_probs``        same values, only with ``include_old_log_probs=True`` (verl's trainer recomputes
                         ``old_log_probs`` and unions it in, so the default leaves the key free)
``rm_scores``            ``[N, R]`` outcome reward on the last trained token (agent-loop name)
``token_level_scores``   same as ``rm_scores``; ``token_level_rewards`` too (before any KL penalty)
=======================  ================================================================================

Non-tensor batch: ``uid`` (the group id — verl's GRPO groups rows by it), ``episode_ids``, ``step_ids``,
``step_meta`` (:class:`StepMeta` objects), ``step_rewards_ext`` (never in the loss), ``truncated``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memrl.data.batch import select_steps
from memrl.types import PackedBatch

INSTALL_HINT = (
    "to_dataproto needs verl: pip install 'memrl[verl]' (or, keeping your torch: "
    "pip install verl --no-deps tensordict codetiming)"
)


def _object_array(values: list[Any]) -> np.ndarray:
    # np.array() would try to broadcast nested sequences; fill an object array element by element instead.
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def to_dataproto(batch: PackedBatch, *, include_old_log_probs: bool = False) -> Any:
    """Build a verl ``DataProto`` (one row per step). Raises ImportError with install hints without verl."""
    try:
        from verl import DataProto
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    if batch.layout != "padded":
        batch = select_steps(batch, range(batch.num_steps), layout="padded")
    scores = batch.token_level_rewards.float()
    tensors = {
        "prompts": batch.prompts,
        "responses": batch.responses,
        "response_mask": batch.response_mask,
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "position_ids": batch.position_ids,
        "rollout_log_probs": batch.old_log_probs.float(),
        "rm_scores": scores,
        "token_level_scores": scores.clone(),
        "token_level_rewards": scores.clone(),
    }
    if include_old_log_probs:
        tensors["old_log_probs"] = batch.old_log_probs.float().clone()
    truncated = batch.truncated if batch.truncated is not None else np.zeros(batch.num_steps, dtype=bool)
    non_tensors = {
        "uid": _object_array(list(batch.group_ids)),
        "episode_ids": _object_array(list(batch.episode_ids)),
        "step_ids": _object_array(list(batch.step_ids)),
        "step_meta": _object_array(list(batch.step_meta)),
        "step_rewards_ext": _object_array(list(batch.step_rewards_ext)),
        "truncated": np.asarray(truncated, dtype=bool),
    }
    return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
