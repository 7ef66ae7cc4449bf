"""The table `memrl train` ends with: held-out scores before and after training, the run dir, next commands."""

from __future__ import annotations

from memrl.train.summary_table import format_summary

SUMMARY = {
    "eval_reward": "exact_match",
    "eval_split": "test",
    "eval_episodes": 48,
    "memory": "memory",
    "steps": 21,
    "wall_s": 360.0,
    "em_start": 0.0,
    "em_start_ci": [0.0, 0.0],
    "em_final": 0.4792,
    "em_final_ci": [0.3333, 0.625],
    "lenient_match_start": 0.3542,
    "lenient_match_start_ci": [0.2292, 0.5],
    "lenient_match_final": 0.5208,
    "lenient_match_final_ci": [0.375, 0.6667],
    "token_f1_start": 0.081,
    "token_f1_start_ci": [0.052, 0.113],
    "token_f1_final": 0.497,
    "token_f1_final_ci": [0.36, 0.633],
    "run_dir": "runs/qs",
    "eval_dir": "runs/qs/eval_final",
    "adapter": "runs/qs/checkpoints/step_000021/adapter",
}


def _row(text: str, label: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(label))
    return line[len(label) :].split()


def test_rows_give_before_after_and_change_with_intervals():
    text = format_summary(SUMMARY)
    assert text.splitlines()[0] == (
        "held-out test split: 48 episodes, memory on; 21 steps, 6.0 min of training"
    )
    assert _row(text, "strict EM") == ["0.000", "(0.000-0.000)", "0.479", "(0.333-0.625)", "+0.479"]
    assert _row(text, "lenient") == ["0.354", "(0.229-0.500)", "0.521", "(0.375-0.667)", "+0.167"]
    assert _row(text, "token F1") == ["0.081", "(0.052-0.113)", "0.497", "(0.360-0.633)", "+0.416"]
    header = next(line for line in text.splitlines() if "before" in line)
    # columns line up: each value starts under its header
    assert text.splitlines()[2].index("0.479") == header.index("after")


def test_run_dir_and_next_commands_name_the_run():
    text = format_summary(SUMMARY)
    assert "run dir: runs/qs" in text
    assert "memrl inspect runs/qs/eval_final" in text
    assert "memrl eval --config EVAL_CONFIG policy.lora_path=runs/qs/checkpoints/step_000021/adapter" in text


def test_an_f1_reward_leads_the_rows_and_is_not_repeated():
    summary = {**SUMMARY, "eval_reward": "token_f1", "em_start": 0.1, "em_final": 0.3}
    summary.update(em_start_ci=None, em_final_ci=None)
    rows = [line.split()[0] for line in format_summary(summary).splitlines()[2:4]]
    assert rows == ["token", "lenient"]
    assert _row(format_summary(summary), "token F1") == ["0.100", "0.300", "+0.200"]
    assert sum(line.startswith("token F1") for line in format_summary(summary).splitlines()) == 1


def test_missing_scores_show_a_dash_and_memory_off_is_named():
    old = {k: v for k, v in SUMMARY.items() if not k.startswith(("lenient", "token_f1"))}
    text = format_summary({**old, "memory": "none"})
    assert _row(text, "lenient") == ["-", "-", "-"]
    assert "memory off (episode.context=none)" in text


def test_a_run_without_evaluation_says_so():
    text = format_summary({"steps": 2, "run_dir": "runs/x", "em_start": None, "em_final": None})
    assert text.splitlines()[0] == "no held-out evaluation (train.final_eval_episodes=0); 2 steps"
    assert "before" not in text and "run dir: runs/x" in text
    assert "memrl inspect" not in text
