"""The table ``memrl train`` ends with: held-out scores before and after training, the run dir, what to run next.

It reads only the run's ``summary.json`` fields (:func:`memrl.train.loop.train`'s return value), so a finished
run prints the same table again from its directory::

    held-out test split: 48 episodes, memory on; 21 steps, 6.0 min of training
                 before               after                change
    strict EM    0.000 (0.000-0.000)  0.479 (0.333-0.625)  +0.479
    lenient      0.354 (0.229-0.500)  0.521 (0.375-0.667)  +0.167
    token F1     0.081 (0.052-0.113)  0.497 (0.360-0.633)  +0.416
"""

from __future__ import annotations

from typing import Any

# Row label of each score: the evaluation reward first (its name, or a friendlier one), then the side metrics.
_LABELS = {
    "exact_match": "strict EM",
    "lenient_match": "lenient",
    "token_f1": "token F1",
    "locomo": "LoCoMo F1",
}
_SIDE = ("lenient_match", "token_f1")


def _cell(value: float | None, ci: list[float] | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" + (f" ({ci[0]:.3f}-{ci[1]:.3f})" if ci else "")


def _rows(summary: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    reward = summary.get("eval_reward") or "exact_match"
    keys = [(reward, "em")] + [(m, m) for m in _SIDE if m != reward]
    rows = []
    for name, key in keys:
        start, final = summary.get(f"{key}_start"), summary.get(f"{key}_final")
        change = f"{final - start:+.3f}" if start is not None and final is not None else "-"
        rows.append((
            _LABELS.get(name, name),
            _cell(start, summary.get(f"{key}_start_ci")),
            _cell(final, summary.get(f"{key}_final_ci")),
            change,
        ))  # fmt: skip
    return rows


def format_summary(summary: dict[str, Any]) -> str:
    """The end-of-run table (module doc) with the run dir and the next commands; without a start or final
    evaluation (``train.final_eval_episodes: 0``) it says so instead of printing empty rows."""
    run_dir = summary.get("run_dir", "?")
    minutes = summary.get("wall_s", 0.0) / 60
    memory = (
        "on" if summary.get("memory", "memory") == "memory" else f"off (episode.context={summary['memory']})"
    )
    steps = summary.get("steps", 0)
    steps = f"{steps} step" + ("" if steps == 1 else "s")
    lines = []
    if summary.get("em_start") is None and summary.get("em_final") is None:
        lines.append(f"no held-out evaluation (train.final_eval_episodes=0); {steps}")
    else:
        lines.append(
            f"held-out {summary.get('eval_split', 'test')} split: {summary.get('eval_episodes')} episodes, "
            f"memory {memory}; {steps}, {minutes:.1f} min of training"
        )
        table = [("", "before", "after", "change"), *_rows(summary)]
        widths = [max(len(row[i]) for row in table) for i in range(4)]
        lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in table]
    lines.append(f"run dir: {run_dir} (summary.json, metrics.jsonl, curve.png, checkpoints/)")
    lines.append("next:")
    if summary.get("eval_dir"):
        lines.append(f"  memrl inspect {summary['eval_dir']}    # the held-out answers after training")
    if summary.get("adapter"):
        lines.append(
            f"  memrl eval --config EVAL_CONFIG policy.lora_path={summary['adapter']}"
            "    # the trained adapter with vs without memory (EVAL_CONFIG e.g. configs/synthetic.yaml)"
        )
    return "\n".join(lines)
