from __future__ import annotations

from memrl.bench.episodes import _model, bench_episodes


def test_model_choice_saves_the_random_model_and_passes_aliases_through(tmp_path):
    assert _model("smollm2-135m", str(tmp_path)) == ("smollm2-135m", "smollm2-135m")
    path, desc = _model("random", str(tmp_path / "random"))
    assert desc == "random-init tiny llama" and (tmp_path / "random" / "config.json").is_file()
    assert path == str(tmp_path / "random")


def test_bench_episodes_reports_speedups_and_shares_with_overrides():
    out = bench_episodes(
        ["--model", "random", "--episodes", "3", "--max-tokens", "8", "--tools", "", "rollout.n=1"]
    )
    assert out["episodes"] == 3 and out["leaves_per_episode"] == 1  # the override wins over --n
    assert out["batched_speedup"] > 0 and out["generation_batched_speedup"] > 0
    shares = out["share_memory"] + out["share_generation"] + out["share_tools"]
    assert out["share_tools"] == 0.0 and 0.5 < shares <= 1.0 + 1e-9
    assert out["memory_encode_ratio"] > 0
    assert out["embedder_dtype"] in ("float32", "bfloat16")  # resolved from memory.embedder_dtype=auto
    # Forward accounting: one episode at a time needs at least as many model forwards as the batch does.
    calls_b, calls_s = out["phase_s_batched"]["forward_calls"], out["phase_s_sequential"]["forward_calls"]
    assert 0 < calls_b <= calls_s
    assert out["generation_forward_ratio"] == calls_s / calls_b
    assert out["forward_cost_ratio"] > 0
    assert (
        0 < out["forward_share_generation_batched"] <= 1
        and 0 < out["forward_share_generation_sequential"] <= 1
    )
