"""``memrl eval``'s report as a short plain-text table (``eval.json`` keeps everything).

Generic over what the report holds: a metric is any score with a ``<metric>_by_<breakdown>`` companion (so
``exact_match``, ``token_f1``, ``locomo``, ``exact_match_pass@8`` ...), a breakdown is any ``_by_<name>`` suffix
(``group`` = question type or LoCoMo category, ``answer_kind``), and the arms are the report's ablations. A new
metric, category or arm shows up without a change here.

    arm         episodes  strict  lenient  F1     tag    prompt tokens
    memory             8  0.000   0.375    0.139  0.000  205 (71 % of history)
    ...
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memrl.episode.write_quality import render_write_quality

# Short column names of the metrics memrl ships; any other metric is shown under its own name.
METRIC_LABELS = {
    "exact_match": "strict",
    "lenient_match": "lenient",
    "token_f1": "F1",
    "answer_tag": "tag",
    "locomo": "locomo",
    "llm_judge": "judge",
}
BREAKDOWN_LABELS = {"group": "question type / category", "answer_kind": "answer kind"}
ARM_LABELS = {"memory": "memory", "no_memory": "no memory", "full_context": "full context"}


def metric_names(scores: Mapping[str, Any]) -> list[str]:
    """Metrics of one arm, shipped ones in :data:`METRIC_LABELS` order, then the others as they come."""
    found = [k for k, v in scores.items() if isinstance(v, int | float) and _breakdowns_of(scores, k)]
    order = list(METRIC_LABELS)
    return sorted(found, key=lambda k: (order.index(k) if k in order else len(order), found.index(k)))


def _breakdowns_of(scores: Mapping[str, Any], metric: str) -> list[str]:
    prefix = f"{metric}_by_"
    return [k[len(prefix) :] for k, v in scores.items() if k.startswith(prefix) and isinstance(v, Mapping)]


def metric_label(name: str) -> str:
    base, _, rest = name.partition("_pass@")
    if rest:
        return f"{METRIC_LABELS.get(base, base)} pass@{rest}"
    return METRIC_LABELS.get(name, name)


def _num(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, int | float) else "–"


def _tokens(scores: Mapping[str, Any]) -> str:
    mean = scores.get("prompt_tokens_mean")
    if mean is None:
        return "–"
    ratio = scores.get("prompt_to_history_token_ratio")
    return f"{mean:,.0f}" + (f" ({ratio:.0%} of history)" if ratio is not None else "")


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric_from: int = 1) -> str:
    """Columns padded to their widest cell; cells from column ``numeric_from`` on are right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            str(c).rjust(w) if i >= numeric_from else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(header), *(line(r) for r in rows)])


def arm_table(ablations: Mapping[str, Mapping[str, Any]], metrics: Sequence[str]) -> str:
    header = ["arm", "episodes", *map(metric_label, metrics), "prompt tokens"]
    rows = []
    for arm, scores in ablations.items():
        episodes = str(scores.get("episodes", "–"))
        if scores.get("failed"):
            episodes += f" ({scores['failed']} failed)"
        rows.append(
            [ARM_LABELS.get(arm, arm), episodes, *(_num(scores.get(m)) for m in metrics), _tokens(scores)]
        )
    return format_table(header, rows)


def breakdown_table(ablations: Mapping[str, Mapping[str, Any]], metrics: Sequence[str], by: str) -> str:
    """One row per (group, arm): the groups any arm reports under ``_by_<by>``, sorted by name."""
    groups = sorted({g for s in ablations.values() for m in metrics for g in s.get(f"{m}_by_{by}", {})})
    header = [BREAKDOWN_LABELS.get(by, by), "arm", "n", *map(metric_label, metrics)]
    rows = []
    for group in groups:
        for i, (arm, scores) in enumerate(ablations.items()):
            size = scores.get("group_sizes", {}).get(group) if by == "group" else None
            cells = [_num(scores.get(f"{m}_by_{by}", {}).get(group)) for m in metrics]
            rows.append(
                [group if i == 0 else "", ARM_LABELS.get(arm, arm), "" if size is None else str(size), *cells]
            )
    if not any(r[2] for r in rows):  # sizes are reported for the question-type groups only
        header, rows = header[:2] + header[3:], [r[:2] + r[3:] for r in rows]
    return format_table(header, rows, numeric_from=2)


def render_eval(report: Mapping[str, Any]) -> str:
    """The arms' scores, then one table per breakdown (skipped when it has a single group)."""
    ablations: Mapping[str, Mapping[str, Any]] = report.get("ablations", {})
    metrics = list(dict.fromkeys(m for s in ablations.values() for m in metric_names(s)))
    head = [str(report["dataset"])] if "dataset" in report else []
    if isinstance(report.get("policy"), Mapping) and "model" in report["policy"]:
        head.append(str(report["policy"]["model"]))
    if "reward" in report:
        head.append(f"reward {report['reward']}")
    if report.get("full_history_tokens_mean"):
        head.append(f"whole history {report['full_history_tokens_mean']:,.0f} tokens")
    if "wall_time_s" in report:
        head.append(f"{report['wall_time_s']:.0f} s")
    title = [" · ".join(head)] if head else []
    if not ablations:
        return "\n".join([*title, "(no arms in the report)"])
    parts = ["\n".join([*title, arm_table(ablations, metrics)])]
    found = {b for s in ablations.values() for m in metrics for b in _breakdowns_of(s, m)}
    for by in sorted(found, key=lambda b: (b != "group", b)):
        table = breakdown_table(ablations, metrics, by)
        if len(table.splitlines()) - 1 > len(ablations):  # more than one group
            parts.append(table)
    writes = [
        render_write_quality(ARM_LABELS.get(a, a), s["memory_writes"])
        for a, s in ablations.items()
        if "memory_writes" in s
    ]
    if writes:
        parts.append("\n".join(writes))
    return "\n\n".join(parts)
