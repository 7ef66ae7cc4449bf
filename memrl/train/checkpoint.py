"""Crash-safe training checkpoints.

A checkpoint is a directory ``<run>/checkpoints/step_<NNNNNN>/`` holding

* ``adapter/`` — the LoRA adapter in standard PEFT format (``PeftModel.from_pretrained`` / vLLM LoRA request);
* ``optimizer.pt`` — the optimizer state;
* ``rng.pt`` — torch, numpy and Python RNG states;
* ``state.json`` — step, data-source position, run counters (generated tokens, wall time, start EM) and any
  component state (replay buffer).

It is written into a temporary sibling directory, every file and the directory are fsync'ed, and only then is
it renamed into place (``os.rename`` is atomic on POSIX). A SIGKILL at any moment leaves either the previous
checkpoints only or the new one complete, never a half-written ``step_*``; stale temporary directories are
removed at the next start. :func:`latest_checkpoint` returns the newest complete one.

A full disk fails the write with one :class:`~memrl.disk.DiskFullError` naming the checkpoint, the space it
needs and the space free; the temporary directory is removed and the previous checkpoints stay as they were.
torch's zip writer reports a full disk only as "unexpected pos", so the space left decides (see
:func:`memrl.disk.is_disk_full`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from memrl.disk import disk_full_error, is_disk_full
from memrl.train.lora import load_adapter_weights, save_adapter, trainable_parameters

logger = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"^step_(\d{6,})$")
TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint directory is unreadable or does not match the run."""


@dataclass
class TrainState:
    """Everything besides tensors that a resumed run needs to continue exactly."""

    step: int = 0
    data_source: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    replay: dict[str, Any] | None = None  # the replay buffer's state_dict (train.replay), None without one


def _fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(Path(dirpath))


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_checkpoint(
    ckpt_root: str | Path, model: Any, optimizer: torch.optim.Optimizer, state: TrainState, keep: int = 2
) -> Path:
    """Atomically write checkpoint ``step_<state.step>`` under ``ckpt_root``; keep the newest ``keep``."""
    root = Path(ckpt_root)
    final = root / f"step_{state.step:06d}"
    tmp = root / f"{TMP_PREFIX}{final.name}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
        save_adapter(model, tmp / "adapter")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(rng_state(), tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps(state.__dict__, indent=1, sort_keys=True))
        _fsync_tree(tmp)
    except Exception as exc:
        full = is_disk_full(exc, root)  # before the partial files are removed, or their space reads as free
        shutil.rmtree(tmp, ignore_errors=True)
        if not full:
            raise
        raise disk_full_error(
            "a checkpoint",
            final,
            _checkpoint_bytes(model, optimizer),
            f"Earlier checkpoints in {root} are untouched: free space there (or move the run directory to a "
            "larger disk and point output_dir at it) and run the same command again to resume from the newest.",
        ) from exc
    if final.exists():  # re-saving the same step (e.g. the final checkpoint): replace it atomically enough
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    _prune(root, keep)
    return final


def _checkpoint_bytes(model: Any, optimizer: torch.optim.Optimizer) -> int:
    """About what one checkpoint takes: the trainable (adapter) weights plus the optimizer's state tensors."""
    adapter = sum(p.numel() * p.element_size() for p in trainable_parameters(model))
    moments = sum(
        t.numel() * t.element_size()
        for per_param in optimizer.state.values()
        for t in per_param.values()
        if isinstance(t, torch.Tensor)
    )
    return adapter + moments


def _prune(root: Path, keep: int) -> None:
    steps = sorted(p for p in root.iterdir() if _STEP_DIR.match(p.name))
    for old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


def clean_stale(ckpt_root: str | Path) -> int:
    """Remove temporary directories a killed run left behind; returns how many."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return 0
    stale = [p for p in root.iterdir() if p.name.startswith(TMP_PREFIX)]
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return len(stale)


def latest_checkpoint(ckpt_root: str | Path) -> Path | None:
    root = Path(ckpt_root)
    if not root.is_dir():
        return None
    steps = sorted(p for p in root.iterdir() if _STEP_DIR.match(p.name) and (p / "state.json").is_file())
    return steps[-1] if steps else None


def load_checkpoint(path: str | Path, model: Any, optimizer: torch.optim.Optimizer) -> TrainState:
    """Restore adapter weights, optimizer and RNG states in place; return the :class:`TrainState`."""
    path = Path(path)
    try:
        data = json.loads((path / "state.json").read_text())
        if isinstance(data, dict) and "extra" in data:  # checkpoints that kept the replay state under "extra"
            data.setdefault("replay", (data.pop("extra") or {}).get("replay"))
        state = TrainState(**data)
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"{path / 'state.json'}: unreadable checkpoint state ({exc})") from exc
    load_adapter_weights(model, path / "adapter")
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
    set_rng_state(torch.load(path / "rng.pt", weights_only=False))
    logger.info("resumed from %s (step %d)", path, state.step)
    return state
