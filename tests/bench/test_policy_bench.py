from __future__ import annotations

from memrl.bench import BENCHES


def test_policy_bench_reuses_the_whole_prefix_and_reports_its_keys():
    out = BENCHES.get("policy")(
        [
            "--model", "random", "--batch", "2", "--prompt-tokens", "8", "--gen-tokens", "4", "--prefix-tokens", "48",
            "--branches", "3", "--branch-tokens", "4", "--repeats", "1", "--threads", "1",
        ]
    )  # fmt: skip
    # Branches continue from the cached prefix: every branch skips exactly the shared prefix.
    assert out["prefix_cached_tokens_per_branch"] == 48
    for key in ("batched_speedup", "prefix_reuse_speedup", "prefix_reuse_speedup_incl_prefix"):
        assert out[key] > 0
    assert out["prefix_reuse_s"] > 0 and out["prefix_recompute_s"] > 0
