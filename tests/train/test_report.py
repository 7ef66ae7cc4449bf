import json

import pytest

from memrl.cli.main import main
from memrl.train.report import ReportError, compare, load_run, seed_bootstrap, tokens_to_reach


def _write_run(
    path, *, seed, em_start, em_final, curve, tokens, eval_reward="exact_match", episodes=200, half_ci=0.07
):
    path.mkdir(parents=True)
    summary = {
        "em_start": em_start,
        "em_final": em_final,
        "em_final_ci": [em_final - half_ci, em_final + half_ci],
        "em_start_ci": [em_start - half_ci, em_start + half_ci],
        "eval_episodes": episodes,
        "generated_tokens": tokens,
        "seed": seed,
        "steps": 10,
        "wall_s": 100.0,
        "config": {"eval_reward": eval_reward},
    }
    (path / "summary.json").write_text(json.dumps(summary))
    rows = [{"step": 0, "eval/em": em_start, "eval/episodes": episodes}]
    rows += [
        {"step": i + 1, "eval/em": em, "eval/episodes": 48, "counters/generated_tokens": t}
        for i, (t, em) in enumerate(curve)
    ]
    rows.append(
        {"step": 99, "eval/em": em_final, "eval/episodes": episodes, "counters/generated_tokens": tokens}
    )
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_run_keeps_only_in_run_points(tmp_path):
    run = load_run(
        _write_run(
            tmp_path / "a", seed=0, em_start=0.0, em_final=0.5, curve=[(10, 0.3), (20, 0.6)], tokens=30
        )
    )
    # The start (step 0) and final (200-episode) evaluations are not in-run points.
    assert run.curve == ((10.0, 0.3), (20.0, 0.6))
    assert tokens_to_reach(run, 0.5) == 20.0
    assert tokens_to_reach(run, 0.7) is None


def test_seed_bootstrap_spans_seed_spread_and_episode_noise(tmp_path):
    same = [
        load_run(_write_run(tmp_path / f"s{i}", seed=i, em_start=0.0, em_final=0.5, curve=[], tokens=1))
        for i in range(3)
    ]
    spread = [
        load_run(_write_run(tmp_path / f"t{i}", seed=i, em_start=0.0, em_final=em, curve=[], tokens=1))
        for i, em in enumerate((0.2, 0.5, 0.8))
    ]
    tight, wide = seed_bootstrap(same)["em_final_ci"], seed_bootstrap(spread)["em_final_ci"]
    assert tight[0] < 0.5 < tight[1]
    # 600 episodes at 0.5: about +-0.04; three seeds 0.2/0.5/0.8 are far wider.
    assert tight[1] - tight[0] < 0.1
    assert wide[1] - wide[0] > 0.3
    gain = seed_bootstrap(same)["gain_ci"]
    assert gain[0] > 0.4  # the start is 0 on every seed: the gain is the final score


def test_compare_reports_tokens_to_reference_em(tmp_path):
    chain = [
        load_run(
            _write_run(
                tmp_path / f"c{i}",
                seed=i,
                em_start=0.0,
                em_final=0.5,
                curve=[(100, 0.2), (200, 0.5)],
                tokens=300,
            )
        )
        for i in range(2)
    ]
    tree = [
        load_run(
            _write_run(tmp_path / "t0", seed=0, em_start=0.0, em_final=0.6, curve=[(60, 0.55)], tokens=300)
        ),
        load_run(
            _write_run(tmp_path / "t1", seed=1, em_start=0.0, em_final=0.3, curve=[(60, 0.3)], tokens=300)
        ),
    ]
    report = compare({"chain": chain, "tree": tree})
    assert report["reference"] == "chain" and report["target_em"] == 0.5
    assert report["arms"]["tree"]["em_final_mean"] == 0.45
    reach = report["tokens_to_reference_em"]["tree"]
    assert reach["per_run"] == [60.0, None] and reach["reached"] == "1/2"
    assert reach["ratio_to_reference_total"] == 0.2
    assert report["tokens_to_reference_em"]["chain"]["tokens_mean"] == 200.0


def test_errors_name_the_file_and_the_problem(tmp_path):
    with pytest.raises(ReportError, match="summary.json: not found"):
        load_run(tmp_path)
    lenient = _write_run(
        tmp_path / "l", seed=0, em_start=0.0, em_final=0.5, curve=[], tokens=1, eval_reward="lenient_match"
    )
    with pytest.raises(ReportError, match="eval_reward='lenient_match'"):
        load_run(lenient)


def test_cli_prints_json_and_draws_the_plot(tmp_path, capsys):
    a = _write_run(tmp_path / "a", seed=0, em_start=0.0, em_final=0.5, curve=[(10, 0.4)], tokens=20)
    b = _write_run(tmp_path / "b", seed=0, em_start=0.0, em_final=0.1, curve=[(10, 0.1)], tokens=20)
    png = tmp_path / "cmp.png"
    assert main(["report", "--arm", "memory", str(a), "--arm", "none", str(b), "--plot", str(png)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["arms"]["none"]["em_final_mean"] == 0.1
    assert png.stat().st_size > 1000
    with pytest.raises(SystemExit, match="names no run directory"):
        main(["report", "--arm", "memory"])


def test_f1_runs_are_compared_by_f1_with_their_own_standard_errors(tmp_path):
    def arm(name, final, half_ci):
        return [
            load_run(
                _write_run(
                    tmp_path / f"{name}{i}",
                    seed=i,
                    em_start=0.10,
                    em_final=final,
                    curve=[],
                    tokens=1,
                    eval_reward="locomo",
                    half_ci=half_ci,
                )
            )
            for i in range(3)
        ]

    precise, noisy = arm("p", 0.2, 0.01), arm("n", 0.2, 0.1)
    report = compare({"memory": precise, "recent": noisy})
    assert report["metric"] == "locomo" and report["arms"]["memory"]["em_final_mean"] == 0.2
    tight, wide = report["arms"]["memory"]["em_final_ci"], report["arms"]["recent"]["em_final_ci"]
    assert tight[0] < 0.2 < tight[1] and tight[1] - tight[0] < 0.03  # three seeds, each +-0.01
    assert wide[1] - wide[0] > 0.08  # each run's interval carries into the arm's
    assert report["arms"]["memory"]["gain_ci"][0] > 0.07  # the gain 0.10 is resolved
    em = [load_run(_write_run(tmp_path / "em", seed=0, em_start=0.0, em_final=0.5, curve=[], tokens=1))]
    with pytest.raises(ReportError, match="different rewards"):
        compare({"memory": precise, "em": em})


def _with_breakdown(path, start, final, half_ci=0.03):
    """Add a LoCoMo-style breakdown (answerable with an interval, adversarial without) to the start and final
    evaluations of a run written by _write_run."""
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    for row, score in ((rows[0], start), (rows[-1], final)):
        row.update(
            {
                "eval/em/answerable": score,
                "eval/em/answerable_ci_low": score - half_ci,
                "eval/em/answerable_ci_high": score + half_ci,
                "eval/em/adversarial": 0.9,
            }
        )
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_subset_reports_one_part_of_the_evaluations(tmp_path, capsys):
    dirs = [
        _with_breakdown(
            _write_run(
                tmp_path / f"s{i}",
                seed=i,
                em_start=0.18,
                em_final=0.38,
                curve=[],
                tokens=1,
                eval_reward="locomo",
                episodes=435,
            ),
            start=0.10,
            final=final,
        )  # fmt: skip
        for i, final in enumerate((0.18, 0.23, 0.23))
    ]
    runs = [load_run(d, "answerable") for d in dirs]
    assert [(r.em_start, r.em_final) for r in runs] == [(0.10, 0.18), (0.10, 0.23), (0.10, 0.23)]
    report = compare({"trained": runs})
    arm = report["arms"]["trained"]
    assert report["metric"] == "locomo/answerable" and arm["em_final_mean"] == pytest.approx(0.2133, abs=1e-4)
    assert arm["em_final_ci"][0] < 0.2133 < arm["em_final_ci"][1] and arm["gain_ci"][0] > 0
    with pytest.raises(
        ReportError, match="no eval/em/adversarial with an interval; subsets with one: .*answerable"
    ):
        load_run(dirs[0], "adversarial")
    with pytest.raises(ReportError, match="different rewards"):
        compare({"all": [load_run(dirs[0])], "part": runs})
    main(["report", "--subset", "answerable", "--arm", "trained", *map(str, dirs)])
    assert json.loads(capsys.readouterr().out)["metric"] == "locomo/answerable"
