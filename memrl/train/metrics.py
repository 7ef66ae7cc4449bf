"""Training metrics: one JSON line per step in ``metrics.jsonl``, TensorBoard scalars, and the curve PNG.

On resume the log is cut back to the checkpoint's step (lines of steps that the killed run wrote after its
last checkpoint are dropped, because the resumed run recomputes them), so ``metrics.jsonl`` of a resumed run
reads exactly like the uninterrupted run's.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a ``metrics.jsonl`` (a torn last line from a kill is ignored)."""
    path = Path(path)
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            logger.warning("%s: ignoring a torn line (the previous run was killed while writing it)", path)
    return out


class MetricsLogger:
    """Appends ``{"step": s, **metrics}`` lines; mirrors scalars to TensorBoard when enabled."""

    def __init__(self, run_dir: str | Path, resume_step: int = 0, tensorboard: bool = True) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        os.replace(tmp, self.path)
        self._fh = open(self.path, "a")  # noqa: SIM115 - kept open for the run
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events the killed run logged after the checkpoint.
            self._tb = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=resume_step + 1)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        self._fh.write(json.dumps({"step": step, **clean}, sort_keys=True) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        if self._tb is not None:
            for k, v in clean.items():
                self._tb.add_scalar(k, v, step)

    def close(self) -> None:
        self._fh.close()
        if self._tb is not None:
            self._tb.close()


def plot_curves(metrics_path: str | Path, out_png: str | Path, title: str = "") -> Path | None:
    """Reward (train) and held-out exact match vs generated tokens, from ``metrics.jsonl``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(metrics_path)
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    # The reward of every sampled episode: train/reward_mean covers only what was trained on, which
    # data.group_filter narrows to the groups with mixed rewards.
    key = "rollout/reward_mean" if any("rollout/reward_mean" in r for r in rows) else "train/reward_mean"
    tr = [r for r in rows if key in r]
    ev = [r for r in rows if "eval/em" in r]
    x = "counters/generated_tokens"
    if tr:
        xs, ys = [r.get(x, r["step"]) for r in tr], [r[key] for r in tr]
        ax.plot(xs, ys, alpha=0.25, color="tab:blue")
        w = max(1, len(ys) // 25)  # a moving average: one step's reward is a handful of prompts
        smooth = [
            sum(ys[max(0, i - w + 1) : i + 1]) / len(ys[max(0, i - w + 1) : i + 1]) for i in range(len(ys))
        ]
        ax.plot(xs, smooth, color="tab:blue", label=f"train reward (rollouts, mean of {w} steps)")
    if ev:
        ax.plot(
            [r.get(x, r["step"]) for r in ev],
            [r["eval/em"] for r in ev],
            marker="o",
            color="tab:orange",
            label="held-out EM",
        )
    ax.set_xlabel("generated tokens" if any(x in r for r in rows) else "step")
    ax.set_ylabel("reward / exact match")
    # A shaped training reward (composite) can exceed 1; exact match cannot.
    top = max([1.0] + [r[key] for r in tr])
    ax.set_ylim(-0.02, top * 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
