"""memrl eval scoring: per-group means over leaf 0, failed episodes score 0, history-token accounting."""

from __future__ import annotations

import pytest
from transformers import ByT5Tokenizer

from memrl.episode.evaluate import full_history_tokens, group_key, history_token_counts, score_ablation
from memrl.rewards import make_reward
from memrl.types import BatchInput, EpisodeStatus, EpisodeTrajectory, StepMeta, StepTrajectory, TurnSpec


def _bi(eid: str, answer: str, **meta) -> BatchInput:
    turns = (
        TurnSpec("history", "Ann lives in Oslo", "D1:1", "Ann", "2023-01-01"),
        TurnSpec("target", "Where?", "Q"),
    )
    return BatchInput(eid, eid, turns, "Where?", answer, meta)


def _traj(eid: str, response: str, leaf: int = 0, failed: bool = False) -> EpisodeTrajectory:
    if failed:
        return EpisodeTrajectory(eid, eid, (), 0.0, EpisodeStatus.FAILED, failure_reason="x")
    meta = StepMeta(source_episode_id=eid, response_text=response)
    step = StepTrajectory(f"{eid}/t{leaf}", (1, 2, 3), (4,), (1,), (0.0,), "Q", meta=meta)
    return EpisodeTrajectory(f"{eid}#{leaf}", eid, (step,), 0.0, EpisodeStatus.COMPLETED)


def test_group_key_prefers_locomo_category_then_question_type():
    assert group_key({"category": 1}) == "multi_hop"
    assert group_key({"category": "5"}) == "adversarial"
    assert group_key({"question_type": "temporal-reasoning"}) == "temporal-reasoning"
    assert group_key({}) == "all"


def test_score_ablation_uses_leaf_zero_and_zero_for_failures():
    inputs = [
        _bi("a", "Oslo", question_type="lookup"),
        _bi("b", "Rome", question_type="lookup"),
        _bi("c", "Bergen", question_type="update"),
    ]
    trajs = [
        _traj("a", "<answer>Oslo</answer>", 0),
        _traj("a", "<answer>wrong</answer>", 1),  # leaf 1 is ignored
        _traj("b", "<answer>Paris</answer>"),
        _traj("c", "", failed=True),
    ]
    out = score_ablation(inputs, trajs, {"exact_match": make_reward("exact_match")})
    assert out["exact_match"] == pytest.approx(1 / 3)
    assert out["exact_match_by_group"] == {"lookup": 0.5, "update": 0.0}
    assert out["failed"] == 1 and out["group_sizes"] == {"lookup": 2, "update": 1}
    assert out["prompt_tokens_mean"] == pytest.approx(2.0)  # 3 + 3 + 0 (failed) over 3


def test_full_history_tokens_counts_the_raw_history():
    tok = ByT5Tokenizer()
    short, long = _bi("a", "x"), _bi("b", "x")
    long = BatchInput("b", "b", (*long.history * 3, long.target), "Where?", "x")
    assert full_history_tokens(tok, long) > full_history_tokens(tok, short) > len("Ann lives in Oslo")


def test_history_token_counts_equal_full_encodes_with_each_history_encoded_once(smollm2_dir, monkeypatch):
    from transformers import AutoTokenizer

    from memrl.episode import evaluate

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    a = _bi("a", "Oslo")
    b = BatchInput(
        "b", "b", (TurnSpec("history", "Bo: I moved to Paris!", "D2:1", "Bo"), a.target), "Bo?", "x"
    )
    longer = BatchInput("c", "c", (*a.history * 4, a.target), "  When did Ann move?\n", "x")
    inputs = [a, BatchInput("a2", "a2", a.turns, "Who lives in Oslo?", "Ann"), b, longer]
    encoded = []
    real = evaluate.encode_chat
    monkeypatch.setattr(evaluate, "encode_chat", lambda t, m: encoded.append(m[0]["content"]) or real(t, m))
    got = history_token_counts(tok, inputs)
    histories = [c for c in encoded if c]
    assert len(histories) == len(set(histories)) == 3  # a's history once for both of its questions
    monkeypatch.setattr(evaluate, "encode_chat", real)
    assert got == [full_history_tokens(tok, bi) for bi in inputs]


def _eval_cfg(model_dir: str, out: str, *extra: str):
    from memrl.config import load_config

    return load_config(
        None,
        [
            f"policy.model={model_dir}",
            f"output_dir={out}",
            "data.adapter=synthetic",
            "data.split=test",
            "data.options={num_episodes: 6}",
            "tools.enabled=[]",
            "rollout.n=1",
            "rollout.temperature=0.0",
            "rollout.max_response_tokens=8",
            "episode.batch_size=3",
            "episode.record_history_turns=false",
            "episode.eval_metrics=[exact_match, token_f1, format]",
            "memory.top_k=4",  # as configs/synthetic.yaml: a few one-turn facts, no summary
            "memory.neighbour_turns=0",
            "episode.use_summary=false",
            *extra,
        ],
    )


def _responses(out, ablations=("memory", "no_memory")) -> dict:
    import glob

    import pandas as pd

    rows = {}
    for ablation in ablations:
        df = pd.concat(
            [pd.read_parquet(f) for f in sorted(glob.glob(f"{out}/{ablation}/trajectories/*.parquet"))]
        )
        rows[ablation] = dict(zip(df["episode_id"], df["response_ids"].map(tuple), strict=True))
    return rows


def test_evaluate_runs_every_ablation_and_accounts_tokens(tiny_llama_dir, tmp_path):
    import json

    from memrl.episode.evaluate import ABLATIONS, evaluate_ablations

    # An 800-token window holds about half of a synthetic history (~1,000 byte tokens, 18 turns).
    cfg = _eval_cfg(
        tiny_llama_dir,
        str(tmp_path),
        "episode.eval_ablations=[memory, no_memory, full_context]",
        "policy.max_model_len=800",
    )
    report = evaluate_ablations(cfg, progress=False)
    assert json.loads((tmp_path / "eval.json").read_text()) == json.loads(json.dumps(report))
    assert set(report["ablations"]) == set(ABLATIONS) == {"memory", "no_memory", "full_context"}
    mem, bare, full = (report["ablations"][a] for a in ("memory", "no_memory", "full_context"))
    for ab in (mem, bare, full):
        assert ab["episodes"] == 6 and ab["failed"] == 0
        assert set(ab["exact_match_by_group"]) == {"lookup", "update", "arithmetic"}
        assert 0.0 <= ab["token_f1"] <= 1.0
        assert (
            ab["prompt_to_history_token_ratio"]
            == ab["prompt_tokens_mean"] / report["full_history_tokens_mean"]
        )
    # Memory puts retrieved facts into the prompt; without memory only the question is there; the recent history
    # fills the window (800 - 8 response tokens) with the latest turns: all below pasting the whole history.
    assert bare["prompt_tokens_mean"] < mem["prompt_tokens_mean"] < full["prompt_tokens_mean"] <= 800 - 8
    assert full["prompt_tokens_mean"] < report["full_history_tokens_mean"]
    assert report["prompt_to_history_token_ratio"] == mem["prompt_to_history_token_ratio"]
    assert 0 < full["context_turns_mean"] < full["context_turns_total_mean"] == 18
    assert 0 < full["context_token_share"] < 1 and "context_turns_mean" not in mem
    responses = _responses(tmp_path, tuple(ABLATIONS))
    assert len(responses["memory"]) == len(responses["no_memory"]) == len(responses["full_context"]) == 6


@pytest.mark.slow  # starts Ray and 2 actors per ablation, each loading torch, MiniLM and the model
def test_evaluate_on_ray_actors_equals_in_process(tiny_llama_dir, tmp_path, ray_local):
    from memrl.episode.evaluate import evaluate_ablations

    local = evaluate_ablations(_eval_cfg(tiny_llama_dir, str(tmp_path / "local")), progress=False)
    on_ray = evaluate_ablations(
        _eval_cfg(
            tiny_llama_dir,
            str(tmp_path / "ray"),
            "episode.worker.use_ray=true",
            "episode.worker.num_workers=2",
            "episode.worker.num_cpus_per_worker=0.5",
        ),
        progress=False,
    )
    assert _responses(tmp_path / "ray") == _responses(tmp_path / "local")  # greedy: same tokens per episode
    for ablation in ("memory", "no_memory"):
        a, b = local["ablations"][ablation], on_ray["ablations"][ablation]
        for key in ("episodes", "failed", "exact_match", "token_f1", "format", "prompt_tokens_mean"):
            assert a[key] == b[key], (ablation, key)


def test_score_ablation_reports_pass_at_n_and_leaf_mean_for_sampled_leaves():
    inputs = [_bi("a", "Oslo"), _bi("b", "Rome"), _bi("c", "Bergen")]
    trajs = [
        _traj("a", "<answer>wrong</answer>", 0),
        _traj("a", "<answer>Oslo</answer>", 1),  # only a later leaf is right: counts for pass@2, not leaf 0
        _traj("b", "<answer>Rome</answer>", 0),
        _traj("b", "<answer>Rome</answer>", 1),
        _traj("c", "<answer>Bergen</answer>", 0),  # a missing second leaf scores 0
    ]
    out = score_ablation(inputs, trajs, {"exact_match": make_reward("exact_match")})
    assert out["leaves_per_input"] == 2
    assert out["exact_match"] == pytest.approx(2 / 3)
    assert out["exact_match_pass@2"] == pytest.approx(1.0)
    assert out["exact_match_leaf_mean"] == pytest.approx(4 / 6)
    single = score_ablation(inputs, [_traj("a", "<answer>Oslo</answer>")], {"em": make_reward("exact_match")})
    assert "leaves_per_input" not in single and "em_pass@1" not in single


def test_answer_kind_breakdown_and_pass_at_n_per_group():
    inputs = [
        _bi("a", "Oslo", question_type="lookup", answer_kind="word"),
        _bi("b", "12", question_type="lookup", answer_kind="number"),
        _bi("c", "7", question_type="update", answer_kind="number"),
    ]
    trajs = [
        _traj("a", "<answer>Oslx</answer>", 0),
        _traj("a", "<answer>Osl</answer>", 1),  # no leaf right: the word kind stays at 0 even for pass@2
        _traj("b", "<answer>3</answer>", 0),
        _traj("b", "<answer>12</answer>", 1),
        _traj("c", "<answer>7</answer>", 0),
        _traj("c", "<answer>7</answer>", 1),
    ]
    out = score_ablation(inputs, trajs, {"exact_match": make_reward("exact_match")})
    assert out["exact_match_by_answer_kind"] == {"number": 0.5, "word": 0.0}
    assert out["exact_match_pass@2_by_answer_kind"] == {"number": 1.0, "word": 0.0}
    assert out["exact_match_pass@2_by_group"] == {"lookup": 0.5, "update": 1.0}
    # Without the key on every input there is no answer-kind breakdown.
    partial = score_ablation(inputs[:1] + [_bi("d", "x")], [], {"em": make_reward("exact_match")})
    assert "em_by_answer_kind" not in partial and partial["em_by_group"] == {"all": 0.0, "lookup": 0.0}


def test_table_has_a_row_per_category_the_answerable_ones_and_all():
    inputs = [
        _bi("a", "Oslo", category=4),
        _bi("b", "Rome", category=4),
        _bi("c", "Bergen", category=2),
        _bi("d", None, category=5, adversarial=True),
    ]
    trajs = [
        _traj("a", "<answer>Oslo</answer>"),
        _traj("b", "Rome, I think"),
        _traj("c", "", failed=True),
        _traj("d", "<answer>Not mentioned in the conversation</answer>"),
    ]
    metrics = {name: make_reward(name) for name in ("locomo", "lenient_match", "answer_tag")}
    table = score_ablation(inputs, trajs, metrics, history_tokens=[30, 60, 30, 15])["table"]
    assert list(table) == ["adversarial", "single_hop", "temporal", "answerable", "all"]
    assert table["single_hop"]["locomo"] == pytest.approx((1.0 + 0.5) / 2)  # F1 of "Rome I think" vs "Rome"
    assert table["single_hop"]["lenient_match"] == 1.0 and table["single_hop"]["answer_tag"] == 0.5
    assert table["temporal"]["locomo"] == 0.0 and table["adversarial"]["locomo"] == 1.0  # failed / abstained
    assert table["answerable"]["locomo"] == pytest.approx(1.5 / 3) and table["answerable"]["episodes"] == 3
    assert table["all"]["prompt_token_share"] == pytest.approx((3 / 30 + 3 / 60 + 0 + 3 / 15) / 4)
    assert table["single_hop"]["prompt_token_share"] == pytest.approx((0.1 + 0.05) / 2)
