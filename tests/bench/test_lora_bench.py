from __future__ import annotations

from memrl.bench import BENCHES


def test_lora_bench_times_three_arms_over_every_linear_layer():
    out = BENCHES.get("lora")(
        ["--model", "random", "--prompt-tokens", "8", "--gen-tokens", "4", "--repeats", "1", "--threads", "1"]
    )
    assert out["lora_layers"] == 21  # 3 layers x 7 linear layers each: LoRA on every one
    for arm in ("bare", "unfolded", "folded"):
        assert out[f"{arm}_ms_per_step"] > 0
    assert out["fold_speedup"] > 0 and out["fold_s"] > 0
