from __future__ import annotations

from memrl.bench import BENCHES
from memrl.policy.engine import shared_attention


def test_attention_bench_times_both_kernels_and_restores_memrl_s():
    single = shared_attention._single_query
    out = BENCHES.get("attention")(
        ["--model", "random", "--dtype", "float32", "--prefix-tokens", "24", "--tails", "40",
         "--decode", "3x30", "--new-tokens", "4", "--repeats", "1", "--threads", "1"]
    )  # fmt: skip
    [tail] = out["tail"]
    assert tail["tail_tokens"] == 40 and tail["memrl_ms"] > 0 and tail["torch_ms"] > 0
    [dec] = out["decode"]
    assert dec["rows"] == 3 and dec["memrl_step_ms"] > 0 and dec["speedup"] > 0
    # float32, the same arithmetic up to rounding: the greedy rows agree
    assert dec["greedy_rows_identical"] == "3/3"
    assert shared_attention._single_query is single  # the reference arm patched nothing for good
