"""``memrl eval``: benchmark scores per category / question type, with and without memory in the same run.

For each ablation (``memory``: retrieved facts + summary in the prompt; ``no_memory``: the question alone;
``full_context``: the most recent raw history turns that fit the model's window) the dataset's episodes are run
once (greedy is the configs' choice) and every leaf-0 answer is scored with ``episode.reward`` plus
``episode.eval_metrics``. Token accounting, per ablation: mean prompt tokens actually sent vs the tokens the whole
raw history would take in the same chat format (what a memory-less long-context agent pays); ``full_context``
also reports how many history turns and tokens its prompts carried vs the whole history.

Each ablation's ``table`` holds the numbers a benchmark reports in one place, one row per group (LoCoMo
category, LongMemEval question type), then ``answerable`` (when some questions are adversarial or abstention
questions: LoCoMo's categories 1–4, the F1 the field reports) and ``all``; each row has every metric's mean,
``prompt_token_share`` (mean over the row's questions of prompt tokens / the whole history's tokens) and
``episodes``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memrl.config import Config
from memrl.episode.output import write_json
from memrl.episode.pipeline import load_inputs, peak_rss_mb, run_episodes
from memrl.episode.recent import turn_line
from memrl.episode.rows import step_meta_of_row
from memrl.episode.write_quality import write_quality
from memrl.policy.models import describe_policy
from memrl.rewards.base import RewardContext, RewardInput, make_reward
from memrl.rewards.benchmarks import LOCOMO_CATEGORY_NAMES, is_abstention_question
from memrl.templates import encode_chat
from memrl.types import BatchInput, EpisodeTrajectory

logger = logging.getLogger(__name__)

# Ablation name (directory under the output dir, key of the report) → episode.context.
ABLATIONS = {"memory": "memory", "no_memory": "none", "full_context": "recent_history"}
# Per-episode coverage of the recent_history context (target step extra, see memrl.episode.recent).
_COVERAGE_KEYS = ("context_turns", "context_turns_total", "context_tokens", "context_tokens_total")


def group_key(metadata: Mapping[str, Any]) -> str:
    """LoCoMo category name, else the question type, else ``all``."""
    if "category" in metadata and metadata["category"] is not None:
        try:
            return LOCOMO_CATEGORY_NAMES.get(int(metadata["category"]), str(metadata["category"]))
        except (TypeError, ValueError):
            return str(metadata["category"])
    return str(metadata.get("question_type") or "all")


def _chat_tokens(tokenizer: Any, system: str, user: str) -> int:
    return len(
        encode_chat(tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": user}])
    )


def full_history_tokens(tokenizer: Any, bi: BatchInput) -> int:
    """Prompt tokens if the whole raw history were pasted in (same chat format as the real prompt)."""
    return _chat_tokens(tokenizer, "\n".join(turn_line(t) for t in bi.history), bi.final_query)


def history_token_counts(tokenizer: Any, inputs: Sequence[BatchInput]) -> list[int]:
    """:func:`full_history_tokens` of each input, each distinct history tokenised once: the questions of a LoCoMo
    conversation share its long history, slow to encode. The chat format's special tokens
    separate the messages, so the count is the history's part plus the question's part."""
    empty = _chat_tokens(tokenizer, "", "")
    histories: dict[str, int] = {}
    out = []
    for bi in inputs:
        text = "\n".join(turn_line(t) for t in bi.history)
        if text not in histories:
            histories[text] = _chat_tokens(tokenizer, text, "")
        out.append(histories[text] + _chat_tokens(tokenizer, "", bi.final_query) - empty)
    return out


def _reward_input(bi: BatchInput, t: EpisodeTrajectory | None) -> tuple[RewardInput, bool]:
    """The scored answer of one leaf and whether it failed (a failed or missing leaf scores 0)."""
    response = t.steps[-1].meta.response_text if t is not None and t.steps else ""
    failed = t is None or t.status.value == "failed"
    return RewardInput.from_response(response, bi.target_answer, bi.final_query, bi.metadata), failed


def score_ablation(
    inputs: Sequence[BatchInput],
    trajs: Sequence[EpisodeTrajectory],
    metric_fns: Mapping[str, Any],
    history_tokens: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Per-metric means overall and per group, over leaf 0 of each input (failed episodes score 0), and the
    ``table`` of them (module doc); ``history_tokens``: each input's :func:`full_history_tokens`.

    With several leaves per input (``rollout.n > 1``, sampled), also ``<metric>_pass@<n>`` (the best leaf's
    score, averaged over inputs: what reinforcement learning could at most sharpen the policy towards) and
    ``<metric>_leaf_mean`` (the mean over all leaves: the expected score of one sample)."""
    leaves: dict[str, list[EpisodeTrajectory]] = defaultdict(list)
    for t in trajs:
        leaves[t.source_episode_id].append(t)
    rows = []
    for bi in inputs:
        t = leaves[bi.episode_id][0] if leaves.get(bi.episode_id) else None
        prompt_tokens = len(t.steps[-1].prompt_ids) if t is not None and t.steps else 0
        rows.append((bi, *_reward_input(bi, t), prompt_tokens))
    scores = {name: fn([r[1] for r in rows]) for name, fn in metric_fns.items()}
    out: dict[str, Any] = {"episodes": len(rows), "failed": sum(r[2] for r in rows)}
    breakdowns = _breakdowns(inputs)
    for name, vals in scores.items():
        vals = [0.0 if rows[i][2] else v for i, v in enumerate(vals)]
        out[name] = sum(vals) / len(vals) if vals else 0.0
        for by, groups in breakdowns.items():
            out[f"{name}_by_{by}"] = _group_means(vals, groups)
    out["group_sizes"] = {g: len(idx) for g, idx in sorted(breakdowns["group"].items())}
    shares = None
    if history_tokens is not None:
        shares = [r[3] / h if h else 0.0 for r, h in zip(rows, history_tokens, strict=True)]
    out["table"] = _table(inputs, breakdowns["group"], scores, [r[2] for r in rows], shares)
    out["prompt_tokens_mean"] = sum(r[3] for r in rows) / len(rows) if rows else 0.0
    out.update(_coverage([leaves[bi.episode_id][0] for bi in inputs if leaves.get(bi.episode_id)]))
    n_leaves = max((len(v) for v in leaves.values()), default=0)
    if n_leaves > 1:
        out["leaves_per_input"] = n_leaves
        out.update(_sampled_scores(inputs, leaves, metric_fns, n_leaves, breakdowns))
    return out


def _table(
    inputs: Sequence[BatchInput],
    groups: Mapping[str, list[int]],
    scores: Mapping[str, Sequence[float]],
    failed: Sequence[bool],
    shares: Sequence[float] | None,
) -> dict[str, dict[str, float]]:
    rows = dict(sorted(groups.items()))
    answerable = [i for i, bi in enumerate(inputs) if not unanswerable(bi.metadata)]
    if 0 < len(answerable) < len(inputs):
        rows["answerable"] = answerable
    rows["all"] = list(range(len(inputs)))
    table = {}
    for name, idx in rows.items():
        row = {m: sum(0.0 if failed[i] else v[i] for i in idx) / len(idx) for m, v in scores.items()}
        if shares is not None:
            row["prompt_token_share"] = sum(shares[i] for i in idx) / len(idx)
        table[name] = {**row, "episodes": float(len(idx))}
    return table


def unanswerable(metadata: Mapping[str, Any]) -> bool:
    """LoCoMo's adversarial (category 5) and LongMemEval's abstention questions: the right answer abstains."""
    return bool(metadata.get("adversarial")) or is_abstention_question(metadata)


def _coverage(trajs: Sequence[EpisodeTrajectory]) -> dict[str, float]:
    """Means of the recent_history coverage over the episodes that report it (``<key>_mean``) and the share of
    the history's tokens the prompts carried; empty for the other contexts."""
    extras = [t.steps[-1].meta.extra for t in trajs if t.steps and "context_turns" in t.steps[-1].meta.extra]
    if not extras:
        return {}
    out = {f"{k}_mean": sum(float(e[k]) for e in extras) / len(extras) for k in _COVERAGE_KEYS}
    total = sum(float(e["context_tokens_total"]) for e in extras)
    out["context_token_share"] = sum(float(e["context_tokens"]) for e in extras) / total if total else 1.0
    return out


def _breakdowns(inputs: Sequence[BatchInput]) -> dict[str, dict[str, list[int]]]:
    """Input indices by :func:`group_key`, and by ``metadata["answer_kind"]`` when every input has one (the
    synthetic task: number vs word answers, which small models learn to copy very differently)."""
    out: dict[str, dict[str, list[int]]] = {"group": defaultdict(list)}
    kinds = [bi.metadata.get("answer_kind") for bi in inputs]
    if inputs and all(k is not None for k in kinds):
        out["answer_kind"] = defaultdict(list)
        for i, k in enumerate(kinds):
            out["answer_kind"][str(k)].append(i)
    for i, bi in enumerate(inputs):
        out["group"][group_key(bi.metadata)].append(i)
    return out


def _group_means(vals: Sequence[float], groups: Mapping[str, list[int]]) -> dict[str, float]:
    return {g: sum(vals[i] for i in idx) / len(idx) for g, idx in sorted(groups.items())}


def _sampled_scores(
    inputs: Sequence[BatchInput],
    leaves: Mapping[str, list[EpisodeTrajectory]],
    metric_fns: Mapping[str, Any],
    n_leaves: int,
    breakdowns: Mapping[str, Mapping[str, list[int]]],
) -> dict[str, Any]:
    """pass@n and per-leaf mean of every metric; inputs with fewer than ``n_leaves`` leaves count the missing
    ones as failed (score 0)."""
    owner, items = [], []
    for i, bi in enumerate(inputs):
        mine = list(leaves.get(bi.episode_id, []))
        for t in mine + [None] * (n_leaves - len(mine)):
            owner.append(i)
            items.append(_reward_input(bi, t))
    out: dict[str, float] = {}
    for name, fn in metric_fns.items():
        vals = [0.0 if failed else v for v, (_, failed) in zip(fn([x for x, _ in items]), items, strict=True)]
        per: list[list[float]] = [[] for _ in inputs]
        for i, v in zip(owner, vals, strict=True):
            per[i].append(v)
        best = [max(p) for p in per]
        out[f"{name}_pass@{n_leaves}"] = sum(best) / len(best) if best else 0.0
        out[f"{name}_leaf_mean"] = sum(vals) / len(vals) if vals else 0.0
        for by, groups in breakdowns.items():
            out[f"{name}_pass@{n_leaves}_by_{by}"] = _group_means(best, groups)
    return out


def evaluate_ablations(
    cfg: Config, out_dir: str | Path | None = None, *, policy: Any = None, progress: bool = True
) -> dict[str, Any]:
    """Run every ablation in ``episode.eval_ablations`` and write ``eval.json``; returns the report.

    Episodes run in process, or on Ray actors with ``episode.worker.use_ray`` (as ``memrl run``); ``policy``
    (built from ``cfg.policy`` if not given) tokenises and serves the ``llm_judge`` metric in the driver."""
    from memrl.episode.build import build_runner
    from memrl.episode.worker import LocalRolloutWorker, RayRolloutWorker

    out = Path(out_dir or cfg.output_dir)
    inputs = load_inputs(cfg)
    if policy is None:
        from memrl.policy import make_policy

        policy = make_policy(cfg.policy)
    names = list(dict.fromkeys([cfg.episode.reward, *cfg.episode.eval_metrics]))
    ctx = RewardContext(policy=policy)
    metric_fns = {
        n: make_reward(n, cfg.episode.reward_options if n == cfg.episode.reward else {}, ctx) for n in names
    }
    report: dict[str, Any] = {
        "dataset": cfg.data.adapter,
        "reward": cfg.episode.reward,
        "policy": describe_policy(cfg.policy),
        "ablations": {},
    }
    hist = history_token_counts(policy.tokenizer, inputs)
    t0 = time.perf_counter()
    for ablation in cfg.episode.eval_ablations:
        if ablation not in ABLATIONS:
            raise ValueError(f"episode.eval_ablations: unknown {ablation!r}; valid: {sorted(ABLATIONS)}")
        sub = dataclasses.replace(
            cfg,
            episode=dataclasses.replace(cfg.episode, context=ABLATIONS[ablation]),
            data=dataclasses.replace(cfg.data, n_samples_per_prompt=1),  # scores map leaves back to inputs
        )
        if sub.episode.worker.use_ray:  # actors build their own policy and memory from the ablation's config
            worker = RayRolloutWorker(sub)
        else:
            worker = LocalRolloutWorker(sub, runner=build_runner(sub, policy=policy))
        ta = time.perf_counter()
        run_episodes(sub, out / ablation, inputs=inputs, worker=worker, progress=progress)
        from memrl.episode.output import TrajectoryWriter

        writer = TrajectoryWriter(out / ablation)
        frame = _frame(writer)
        report["ablations"][ablation] = score_ablation(inputs, _reload(frame, writer), metric_fns, hist)
        if (quality := write_quality(_history_rows(frame))) is not None:
            report["ablations"][ablation]["memory_writes"] = quality
        report["ablations"][ablation]["wall_time_s"] = time.perf_counter() - ta
        worker.close()
    report["full_history_tokens_mean"] = sum(hist) / len(hist) if hist else 0.0
    full = report["full_history_tokens_mean"]
    if full:
        for scores in report["ablations"].values():
            scores["prompt_to_history_token_ratio"] = scores["prompt_tokens_mean"] / full
    memory = report["ablations"].get("memory", {})
    if "prompt_to_history_token_ratio" in memory:  # the headline: what memory saves over pasting the history
        report["prompt_to_history_token_ratio"] = memory["prompt_to_history_token_ratio"]
    report["wall_time_s"] = time.perf_counter() - t0
    report["peak_rss_mb"] = peak_rss_mb()
    write_json(out / "eval.json", report)
    return report


def _frame(writer: Any) -> Any:
    """Every committed Parquet row of one arm (also covers resumed runs)."""
    import pandas as pd

    parts = sorted(writer.parts_dir.glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(p) for p in parts]) if parts else pd.DataFrame()


def _history_rows(frame: Any) -> list[dict[str, Any]]:
    """The memory-writing rows of an arm, with only the columns :func:`write_quality` reads."""
    if frame.empty:
        return []
    cols = [c for c in ("turn_role", "role", "write", "extra", "memory_ops") if c in frame.columns]
    return frame.loc[frame.turn_role == "history", cols].to_dict("records")


def _reload(frame: Any, writer: Any) -> list[EpisodeTrajectory]:
    """Leaf-0 trajectories rebuilt from an arm's rows (:func:`_frame`) and its failed manifests."""
    from memrl.types import EpisodeStatus, StepTrajectory, TurnRole

    out: list[EpisodeTrajectory] = []
    if not frame.empty:
        target = frame[frame.turn_role == "target"]
        for _, r in target.iterrows():
            step = StepTrajectory(
                step_id=r.step_id,
                prompt_ids=tuple(int(x) for x in r.prompt_ids),
                response_ids=(),
                response_mask=(),
                logprobs=(),
                turn_id=r.turn_id,
                turn_role=TurnRole.TARGET,
                meta=step_meta_of_row(r.to_dict()),
            )
            out.append(
                EpisodeTrajectory(r.episode_id, r.group_id, (step,), float(r.reward), EpisodeStatus(r.status))
            )
    for e in writer.manifests():
        if e["status"] == "failed":
            out.append(
                EpisodeTrajectory(
                    e["episode_id"],
                    e["group_id"],
                    (),
                    0.0,
                    EpisodeStatus.FAILED,
                    failure_reason=e["failure_reason"],
                )
            )
    return out


def clear_results(out_dir: str | Path) -> None:
    """Remove what ``memrl run`` / ``memrl eval`` wrote under ``out_dir`` (and nothing else)."""
    import shutil

    out = Path(out_dir)
    for sub in [out, *(out / a for a in ABLATIONS)]:
        for d in ("trajectories", "manifests"):
            shutil.rmtree(sub / d, ignore_errors=True)
        for f in ("metrics.json", "eval.json", "job.json"):
            (sub / f).unlink(missing_ok=True)
