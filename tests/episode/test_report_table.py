"""The eval table: arms x metrics, then per-group rows, built from reports that score_ablation really makes."""

from __future__ import annotations

import json
from pathlib import Path

from memrl.episode.evaluate import score_ablation
from memrl.episode.report_table import metric_names, render_eval
from memrl.rewards import make_reward
from tests.episode.test_evaluate import _bi, _traj

# eval.json of `memrl eval --config configs/synthetic.yaml data.options.num_episodes=8` (SmolLM2-135M).
REAL_EVAL = Path(__file__).parent / "fixtures" / "eval_synthetic_8.json"
METRICS = ("exact_match", "lenient_match", "token_f1", "answer_tag")


def _report(inputs, arms: dict[str, list]) -> dict:
    fns = {m: make_reward(m) for m in METRICS}
    ablations = {arm: score_ablation(inputs, trajs, fns) for arm, trajs in arms.items()}
    for i, scores in enumerate(ablations.values()):
        scores["prompt_to_history_token_ratio"] = 0.5 / (i + 1)
    return {"dataset": "synthetic", "reward": "exact_match", "ablations": ablations, "wall_time_s": 12.3}


def _rows(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_arm_rows_hold_every_metric_episodes_and_token_share():
    inputs = [_bi("a", "Oslo", question_type="lookup"), _bi("b", "Rome", question_type="update")]
    report = _report(
        inputs,
        {
            "memory": [_traj("a", "<answer>Oslo</answer>"), _traj("b", "It is Rome")],
            "no_memory": [_traj("a", "no idea"), _traj("b", "", failed=True)],
        },
    )
    text = render_eval(report)
    lines = text.splitlines()
    assert lines[0] == "synthetic · reward exact_match · 12 s"
    assert lines[1].split() == ["arm", "episodes", "strict", "lenient", "F1", "tag", "prompt", "tokens"]
    memory = lines[2].split()
    # a: tagged exact answer; b: gold in an untagged answer (lenient only).
    assert memory[:6] == ["memory", "2", "0.500", "1.000", "0.750", "0.500"]
    assert memory[6:] == ["3", "(50%", "of", "history)"]
    assert lines[3].startswith("no memory") and "2 (1 failed)" in lines[3]
    # The per-group table: one row per (question type, arm), the group named once.
    groups = text.split("\n\n")[1].splitlines()
    assert groups[0].split()[:6] == ["question", "type", "/", "category", "arm", "n"]
    assert groups[1].split()[:4] == ["lookup", "memory", "1", "1.000"]
    assert groups[2].split()[:3] == ["no", "memory", "1"]
    assert groups[3].split()[:2] == ["update", "memory"]


def test_groups_metrics_and_arms_come_from_the_report():
    """LoCoMo-shaped: five categories, F1 / lenient / tag and the locomo reward, three arms; nothing named
    here is known to the renderer beforehand except the column labels."""
    inputs = [_bi(f"q{c}", "Oslo", category=c) for c in (1, 2, 3, 4, 5)]
    answers = [_traj(f"q{c}", "<answer>Oslo</answer>" if c % 2 else "Bergen") for c in (1, 2, 3, 4, 5)]
    fns = {m: make_reward(m) for m in ("locomo", "token_f1", "lenient_match", "answer_tag")}
    ablations = {arm: score_ablation(inputs, answers, fns) for arm in ("memory", "no_memory", "full_context")}
    text = render_eval({"ablations": ablations})
    arms, groups = text.split("\n\n")
    assert _rows(arms)[0] == ["arm", "episodes", "lenient", "F1", "tag", "locomo", "prompt", "tokens"]
    assert [r[0] for r in _rows(arms)[1:]] == ["memory", "no", "full"]
    names = [r[0] for r in _rows(groups)[1:] if r[0] not in ("no", "full", "memory")]
    assert names == ["adversarial", "multi_hop", "open_domain", "single_hop", "temporal"]
    assert len(_rows(groups)) == 1 + 5 * 3


def test_pass_at_n_is_a_metric_of_its_own_and_a_single_group_gets_no_table():
    inputs = [_bi("a", "Oslo"), _bi("b", "Rome")]
    trajs = [
        _traj("a", "<answer>x</answer>", 0),
        _traj("a", "<answer>Oslo</answer>", 1),
        _traj("b", "<answer>Rome</answer>", 0),
        _traj("b", "<answer>Rome</answer>", 1),
    ]
    scores = score_ablation(inputs, trajs, {"exact_match": make_reward("exact_match")})
    assert metric_names(scores) == ["exact_match", "exact_match_pass@2"]
    text = render_eval({"ablations": {"memory": scores}})
    assert _rows(text)[0] == ["arm", "episodes", "strict", "strict", "pass@2", "prompt", "tokens"]
    assert _rows(text)[1][:4] == ["memory", "2", "0.500", "1.000"]
    assert "\n\n" not in text  # every input is in group "all": no per-group table


def test_a_real_eval_json_renders_arms_question_types_and_answer_kinds():
    text = render_eval(json.loads(REAL_EVAL.read_text()))
    head, arms, groups, kinds = text.split("\n\n")[0].splitlines()[0], *text.split("\n\n")
    assert head == "synthetic · smollm2-135m · reward exact_match · whole history 548 tokens · 21 s"
    assert _rows(arms)[2][:7] == ["memory", "8", "0.000", "0.375", "0.136", "0.000", "208"]
    assert _rows(arms)[3][:8] == ["no", "memory", "8", "0.000", "0.000", "0.000", "0.000", "83"]
    assert [r[0] for r in _rows(groups)[1::2]] == ["arithmetic", "lookup", "update"]
    assert _rows(groups)[3] == ["lookup", "memory", "3", "0.000", "1.000", "0.362", "0.000"]
    assert _rows(kinds)[0] == ["answer", "kind", "arm", "strict", "lenient", "F1", "tag"]  # no sizes: no n
    assert len(text.splitlines()) < 25
