"""Compare training runs across seeds: ``memrl report --arm NAME RUN_DIR... [--arm ...]``.

A run directory is what ``memrl train`` writes (``summary.json`` + ``metrics.jsonl``). Runs of one arm are seeds
of one configuration; the first arm is the reference the others are compared with. All runs share one
evaluation reward (``train.eval_reward``), the report's ``metric``: strict exact match for the synthetic task,
LoCoMo's official F1 (``locomo``) for ``configs/locomo_train.yaml``.

Per arm: the mean start and final held-out score over seeds, the mean gain, and a 95 % interval from a two-level
bootstrap (resample seeds, then each seed's evaluation episodes), so the interval carries both the seed-to-seed
spread and the finite evaluation set. The episode level is redrawn from each run's score and episode count: as a
binomial for a 0/1 metric (exact), and for an F1 from a normal with the run's own standard error, read off the
bootstrap interval its evaluation wrote (``(high - low) / 3.92``). Other rewards are refused.

``subset`` (``memrl report --subset answerable``) reports one part of the evaluation instead of all of it: the
score of the start and final evaluations' breakdown ``eval/em/<subset>`` (LoCoMo's categories 1–4, its headline
F1, are ``answerable``), redrawn from a normal with the standard error of that part's own interval.

Token efficiency: for each arm, the generated tokens at which its in-run evaluation (the fixed subset evaluated
every ``train.eval_every`` steps) first reaches the reference arm's mean final score, against the reference's
own total tokens. In-run evaluations use fewer episodes than the final one (or, as LoCoMo's, another split), so
a single crossing is noisy; the curve plot shows the whole trajectory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memrl.train.metrics import read_metrics

_BINARY_REWARDS = ("exact_match",)
# Means of per-question scores in [0, 1]: redrawn from a normal (module doc).
_F1_REWARDS = ("locomo", "token_f1", "longmemeval")
_Z95 = 1.96


class ReportError(ValueError):
    """A run directory that cannot be reported (missing files, an evaluation reward it cannot resample)."""


@dataclass(frozen=True)
class RunRecord:
    """One finished ``memrl train`` run: its summary and its in-run evaluation curve."""

    path: Path
    seed: int
    metric: str  # train.eval_reward
    em_start: float
    em_final: float
    em_final_ci: tuple[float, float] | None
    em_start_ci: tuple[float, float] | None
    eval_episodes: int
    generated_tokens: int
    wall_s: float
    steps: int
    curve: tuple[tuple[float, float], ...]  # (generated tokens, in-run exact match)
    subset: str | None = None  # a part of the evaluation (eval/em/<subset>) instead of all of it


def load_run(path: str | Path, subset: str | None = None) -> RunRecord:
    """Read a run directory (its ``subset`` of the evaluation, if given); errors name the file and what is
    missing."""
    path = Path(path)
    summary_path = path / "summary.json"
    if not summary_path.is_file():
        raise ReportError(f"{summary_path}: not found (is {path} a finished `memrl train` output_dir?)")
    summary = json.loads(summary_path.read_text())
    for key in ("em_start", "em_final", "eval_episodes", "generated_tokens", "seed"):
        if summary.get(key) is None:
            raise ReportError(
                f"{summary_path}: field {key!r} is missing or null (the run has no final evaluation)"
            )
    reward = summary.get("config", {}).get("eval_reward")
    if reward not in _BINARY_REWARDS + _F1_REWARDS:
        raise ReportError(
            f"{summary_path}: train.eval_reward={reward!r}; the seed bootstrap needs a 0/1 metric "
            f"({', '.join(_BINARY_REWARDS)}) or an F1 ({', '.join(_F1_REWARDS)})"
        )
    if reward in _F1_REWARDS and not (summary.get("em_final_ci") and summary.get("em_start_ci")):
        raise ReportError(
            f"{summary_path}: an F1 run needs em_start_ci and em_final_ci (its standard errors)"
        )
    rows = read_metrics(path / "metrics.jsonl")
    full = int(summary["eval_episodes"])
    key = "eval/em" if subset is None else f"eval/em/{subset}"
    # In-run points only: the start and final evaluations (all eval_episodes) are in the summary.
    curve = tuple(
        (float(r["counters/generated_tokens"]), float(r[key]))
        for r in rows
        if key in r and "counters/generated_tokens" in r and int(r.get("eval/episodes", 0)) != full
    )
    scores = {
        "start": (summary["em_start"], summary.get("em_start_ci")),
        "final": (summary["em_final"], summary.get("em_final_ci")),
    }
    if subset is not None:
        scores = _subset_scores(path / "metrics.jsonl", rows, full, subset)
    return RunRecord(
        path=path,
        seed=int(summary["seed"]),
        metric=str(reward),
        em_start=float(scores["start"][0]),
        em_final=float(scores["final"][0]),
        em_final_ci=tuple(scores["final"][1]) if scores["final"][1] else None,
        em_start_ci=tuple(scores["start"][1]) if scores["start"][1] else None,
        eval_episodes=full,
        generated_tokens=int(summary["generated_tokens"]),
        wall_s=float(summary.get("wall_s", 0.0)),
        steps=int(summary.get("steps", 0)),
        curve=curve,
        subset=subset,
    )


def _subset_scores(file: Path, rows: list[dict], full: int, subset: str) -> dict[str, tuple]:
    """``subset``'s score and interval in the first and last full evaluations (start and final)."""
    key = f"eval/em/{subset}"
    evals = [r for r in rows if int(r.get("eval/episodes", 0)) == full and "eval/em" in r]
    if len(evals) < 2:
        raise ReportError(f"{file}: no start and final evaluation of all {full} episodes")
    out = {}
    for which, row in (("start", evals[0]), ("final", evals[-1])):
        if f"{key}_ci_low" not in row:
            parts = sorted(
                k[len("eval/em/") : -len("_ci_low")]
                for k in row
                if k.endswith("_ci_low") and k != "eval/em_ci_low"
            )
            raise ReportError(
                f"{file}: the {which} evaluation (step {row.get('step')}) has no {key} with an interval; "
                f"subsets with one: {parts or 'none'}"
            )
        out[which] = (row[key], (row[f"{key}_ci_low"], row[f"{key}_ci_high"]))
    return out


def seed_bootstrap(
    runs: list[RunRecord], resamples: int = 4000, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """95 % intervals of the mean final score and of the mean gain (final - start) over seeds."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(runs), size=(resamples, len(runs)))
    final_draw = _episode_draw(rng, runs, picks, "final")
    start_draw = _episode_draw(rng, runs, picks, "start")
    finals = final_draw.mean(axis=1)
    gains = (final_draw - start_draw).mean(axis=1)
    interval = lambda x: (round(float(np.percentile(x, 2.5)), 4), round(float(np.percentile(x, 97.5)), 4))  # noqa: E731
    return {"em_final_ci": interval(finals), "gain_ci": interval(gains)}


def _episode_draw(
    rng: np.random.Generator, runs: list[RunRecord], picks: np.ndarray, which: str
) -> np.ndarray:
    """The picked runs' scores ``[resamples, n_runs]`` with their evaluation sets redrawn (module doc)."""
    mean = np.array([getattr(r, f"em_{which}") for r in runs])[picks]
    if runs[0].metric in _BINARY_REWARDS and runs[0].subset is None:  # a subset's episode count is not logged
        n = np.array([r.eval_episodes for r in runs])[picks]
        return rng.binomial(n, mean) / n
    se = np.array([(hi - lo) / (2 * _Z95) for lo, hi in (getattr(r, f"em_{which}_ci") for r in runs)])
    return rng.normal(mean, se[picks])


def tokens_to_reach(run: RunRecord, target: float) -> float | None:
    """Generated tokens at the first in-run evaluation scoring >= ``target`` (None if never)."""
    return next((tokens for tokens, em in run.curve if em >= target), None)


def summarize_arm(runs: list[RunRecord]) -> dict[str, Any]:
    mean = lambda xs: round(float(np.mean(xs)), 4)  # noqa: E731
    return {
        "seeds": sorted(r.seed for r in runs),
        "runs": [
            {
                "path": str(r.path),
                "seed": r.seed,
                "em_start": r.em_start,
                "em_final": r.em_final,
                "em_final_ci": list(r.em_final_ci) if r.em_final_ci else None,
                "generated_tokens": r.generated_tokens,
                "steps": r.steps,
                "wall_s": r.wall_s,
            }
            for r in runs
        ],
        "em_start_mean": mean([r.em_start for r in runs]),
        "em_final_mean": mean([r.em_final for r in runs]),
        "gain_mean": mean([r.em_final - r.em_start for r in runs]),
        **{k: list(v) for k, v in seed_bootstrap(runs).items()},
        "generated_tokens_mean": mean([r.generated_tokens for r in runs]),
        "wall_s_mean": mean([r.wall_s for r in runs]),
        "steps_mean": mean([r.steps for r in runs]),
    }


def compare(arms: dict[str, list[RunRecord]]) -> dict[str, Any]:
    """The report: every arm's summary, and each arm's tokens to reach the reference's final score."""
    if not arms or any(not runs for runs in arms.values()):
        raise ReportError("every --arm needs at least one run directory")
    metrics = {
        r.metric if r.subset is None else f"{r.metric}/{r.subset}" for runs in arms.values() for r in runs
    }
    if len(metrics) > 1:
        raise ReportError(
            f"the runs were evaluated with different rewards {sorted(metrics)}; compare like with like"
        )
    reference = next(iter(arms))
    summaries = {name: summarize_arm(runs) for name, runs in arms.items()}
    target = summaries[reference]["em_final_mean"]
    ref_tokens = summaries[reference]["generated_tokens_mean"]
    reach: dict[str, Any] = {}
    for name, runs in arms.items():
        per_run = [tokens_to_reach(r, target) for r in runs]
        reached = [t for t in per_run if t is not None]
        reach[name] = {
            "per_run": per_run,
            "reached": f"{len(reached)}/{len(runs)}",
            # Mean over the runs that got there; with some runs short of the target it flatters the arm, so
            # "reached" says how many did.
            "tokens_mean": round(float(np.mean(reached)), 1) if reached else None,
            "ratio_to_reference_total": round(float(np.mean(reached)) / ref_tokens, 3) if reached else None,
        }
    return {
        "reference": reference,
        "metric": metrics.pop(),
        "target_em": target,
        "arms": summaries,
        "tokens_to_reference_em": reach,
    }


def plot_report(arms: dict[str, list[RunRecord]], out_png: str | Path) -> Path:
    """In-run exact match vs generated tokens, one line per run, one colour per arm; final evaluations with
    their intervals as points at each run's last token count."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, runs) in enumerate(arms.items()):
        colour = f"C{i}"
        for j, run in enumerate(runs):
            xs = [0.0] + [t for t, _ in run.curve]
            ys = [run.em_start] + [em for _, em in run.curve]
            ax.plot(xs, ys, color=colour, alpha=0.55, label=f"{name} (in-run)" if j == 0 else None)
            lo, hi = run.em_final_ci or (run.em_final, run.em_final)
            ax.errorbar(
                run.generated_tokens,
                run.em_final,
                yerr=[[run.em_final - lo], [hi - run.em_final]],
                fmt="o",
                color=colour,
                capsize=3,
                label=f"{name} (final, {run.eval_episodes} episodes)" if j == 0 else None,
            )
    ax.set_xlabel("generated tokens")
    metric = next(iter(arms.values()))[0].metric
    ax.set_ylabel(f"held-out {'strict exact match' if metric in _BINARY_REWARDS else metric + ' F1'}")
    ax.set_ylim(-0.02, 1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper right")  # the curves stay low on the left, clear of it
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


__all__ = [
    "ReportError",
    "RunRecord",
    "compare",
    "load_run",
    "plot_report",
    "seed_bootstrap",
    "tokens_to_reach",
]
