"""RolloutDataSource: epochs, offset, per-epoch shuffle and GRPO groups over a list of :class:`BatchInput`.

Sampling is sequential and cyclic (slime semantics): each call takes the next ``num_prompts`` prompts of the
current epoch's order and wraps into the next epoch when the epoch runs out. Every prompt draw becomes one
group of ``n_samples_per_prompt`` copies that share a ``group_id`` (``"<episode_id>@e<epoch>"``, unique per
draw) and carry globally unique, monotonically increasing ``sample_index`` values. With more than one copy each
copy gets its own ``episode_id`` (``"<episode_id>~<k>"``): the runner runs every episode id once per batch, so
copies sharing an id would all but one fail as duplicates.

The whole progress is three integers (``epoch``, ``offset``, ``sample_index``); the epoch order is a pure
function of ``(seed, epoch)``, so :meth:`state_dict` / :meth:`save` plus :meth:`load` resume a run exactly:
no prompt lost, none repeated.

    >>> source = RolloutDataSource(inputs, n_samples_per_prompt=4, seed=0)
    >>> groups = source.get_samples(2)          # [[A~0, A~1, A~2, A~3], [B~0, B~1, B~2, B~3]]
    >>> source.save("run/data_source.json")      # atomic; later: source.load("run/data_source.json")
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from memrl.data.config import DataConfig
from memrl.types import BatchInput

logger = logging.getLogger(__name__)

STATE_VERSION = 1


class DataSourceStateError(ValueError):
    """A saved data-source state does not fit this data source (other dataset, other sampling settings)."""


def _fingerprint(inputs: Sequence[BatchInput]) -> str:
    """Hash of the episode ids in dataset order: a resumed run must sample the very same dataset."""
    h = hashlib.sha256()
    for inp in inputs:
        h.update(inp.episode_id.encode("utf-8"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def write_json_atomic(path: str | Path, payload: Any) -> None:
    """Write JSON so that a crash never leaves a half-written file: temp file in the same dir, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(payload, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class RolloutDataSource:
    """Sequential, cyclic sampler of prompt groups with resumable state.

    Args:
        inputs: the dataset; episode ids must be unique (they name the groups).
        n_samples_per_prompt: copies per prompt (the GRPO group size).
        shuffle: shuffle the order once per epoch with a generator seeded by ``(seed, epoch)``.
        seed: shuffle seed.
    """

    def __init__(
        self,
        inputs: Sequence[BatchInput],
        *,
        n_samples_per_prompt: int = 1,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        inputs = list(inputs)
        if not inputs:
            raise ValueError("RolloutDataSource needs at least one BatchInput; the dataset is empty")
        for i, inp in enumerate(inputs):
            if not isinstance(inp, BatchInput):
                raise TypeError(f"RolloutDataSource: item {i} is {type(inp).__name__}, expected BatchInput")
        seen: dict[str, int] = {}
        for i, inp in enumerate(inputs):
            if inp.episode_id in seen:
                raise ValueError(
                    f"RolloutDataSource: episode_id {inp.episode_id!r} appears at items {seen[inp.episode_id]}"
                    f" and {i}; episode ids must be unique because they name the sampled groups"
                )
            seen[inp.episode_id] = i
        if n_samples_per_prompt < 1:
            raise ValueError(f"n_samples_per_prompt must be >= 1, got {n_samples_per_prompt}")
        self._inputs = inputs
        self.n_samples_per_prompt = int(n_samples_per_prompt)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.offset = 0
        self.sample_index = 0
        self._fingerprint = _fingerprint(inputs)
        self._order_epoch = -1
        self._order = np.arange(0)

    @classmethod
    def from_config(cls, config: DataConfig, inputs: Sequence[BatchInput]) -> RolloutDataSource:
        """Build from the data config (``n_samples_per_prompt``, ``shuffle``, ``seed``)."""
        return cls(
            inputs,
            n_samples_per_prompt=config.n_samples_per_prompt,
            shuffle=config.shuffle,
            seed=config.seed,
        )

    def __len__(self) -> int:
        return len(self._inputs)

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order_epoch != epoch:
            n = len(self._inputs)
            if self.shuffle:
                # SeedSequence mixes (seed, epoch) so neighbouring epochs get unrelated permutations.
                self._order = np.random.default_rng([self.seed, epoch]).permutation(n)
            else:
                self._order = np.arange(n)
            self._order_epoch = epoch
        return self._order

    def get_samples(self, num_prompts: int) -> list[list[BatchInput]]:
        """The next ``num_prompts`` groups, each ``n_samples_per_prompt`` copies of one prompt."""
        if num_prompts < 0:
            raise ValueError(f"num_prompts must be >= 0, got {num_prompts}")
        groups: list[list[BatchInput]] = []
        for _ in range(num_prompts):
            if self.offset >= len(self._inputs):
                self.epoch += 1
                self.offset = 0
                logger.info("data source: starting epoch %d", self.epoch)
            prompt = self._inputs[int(self._epoch_order(self.epoch)[self.offset])]
            self.offset += 1
            group_id = f"{prompt.episode_id}@e{self.epoch}"
            group = []
            for k in range(self.n_samples_per_prompt):
                episode_id = (
                    prompt.episode_id if self.n_samples_per_prompt == 1 else f"{prompt.episode_id}~{k}"
                )
                group.append(
                    dataclasses.replace(
                        prompt, episode_id=episode_id, group_id=group_id, sample_index=self.sample_index
                    )
                )
                self.sample_index += 1
            groups.append(group)
        return groups

    # -- resumable state ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "epoch": self.epoch,
            "offset": self.offset,
            "sample_index": self.sample_index,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "n_samples_per_prompt": self.n_samples_per_prompt,
            "dataset_size": len(self._inputs),
            "dataset_fingerprint": self._fingerprint,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore progress. Refuses a state saved over another dataset or with other sampling settings."""
        expected = self.state_dict()
        missing = sorted(set(expected) - set(state))
        if missing:
            raise DataSourceStateError(
                f"data source state is missing keys {missing}; expected {sorted(expected)}"
            )
        for key in (
            "version",
            "seed",
            "shuffle",
            "n_samples_per_prompt",
            "dataset_size",
            "dataset_fingerprint",
        ):
            if state[key] != expected[key]:
                raise DataSourceStateError(
                    f"data source state has {key}={state[key]!r} but this data source has {expected[key]!r}; "
                    "resume with the same dataset and data.* sampling settings (or start a fresh run)"
                )
        epoch, offset, index = int(state["epoch"]), int(state["offset"]), int(state["sample_index"])
        if epoch < 0 or not 0 <= offset <= len(self._inputs) or index < 0:
            raise DataSourceStateError(
                f"data source state out of range: epoch={epoch}, offset={offset} (dataset size "
                f"{len(self._inputs)}), sample_index={index}"
            )
        self.epoch, self.offset, self.sample_index = epoch, offset, index

    def save(self, path: str | Path) -> None:
        write_json_atomic(path, self.state_dict())

    def load(self, path: str | Path) -> None:
        path = Path(path)
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataSourceStateError(f"{path}: not a data source state file: {exc}") from exc
        if not isinstance(state, dict):
            raise DataSourceStateError(f"{path}: expected a JSON object, got {type(state).__name__}")
        self.load_state_dict(state)
