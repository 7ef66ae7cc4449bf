from __future__ import annotations

import pytest

from memrl.bench import BENCHES

QUICK = ["--groups", "2", "--group-size", "3", "--prompt-min", "20", "--prompt-max", "40"]
QUICK += ["--response-max", "8", "--layers", "1", "--hidden", "32", "--repeats", "1", "--threads", "1"]


def test_bench_batch_times_the_trainer_path_against_the_padded_reference_on_the_same_tokens():
    result = BENCHES.get("batch")(QUICK)
    assert set(result["speedup"]) == set(result["cpu_speedup"]) == {"shared_prefix", "padded", "per_row"}
    assert result["speedup"]["padded"] == 1.0 and result["cpu_speedup"]["padded"] == 1.0
    assert result["num_sequences"] == 6
    # the same tokens, the same model: the same summed loss
    assert result["speedup_base"] == "padded" and max(result["loss_rel_diff"].values()) <= 1e-5
    assert all(loss > 0 for loss in result["losses"].values())
    forwarded = result["forwarded_tokens"]
    # shared_prefix forwards each group's prompt once (plus response padding); padded every prompt 3 times
    assert forwarded["shared_prefix"] < result["real_tokens"] <= forwarded["padded"]
    assert result["micro_batches"] == {"shared_prefix": 2, "padded": 1, "per_row": 6}  # a group of 3 each


def test_bench_batch_memory_write_shape_gathers_distinct_prompts_over_their_common_prefix():
    shape = [
        "--common-prefix",
        "70",
        "--prompt-min",
        "80",
        "--prompt-max",
        "90",
    ]  # ≥ MIN_COMMON_PREFIX shared
    args = [*QUICK, *shape, "--groups", "1", "--group-size", "5"]
    result = BENCHES.get("batch")(args)
    assert result["micro_batches"] == {"shared_prefix": 1, "padded": 1, "per_row": 5}
    forwarded = result["forwarded_tokens"]
    # the 70 shared tokens once, instead of once per row
    assert (
        forwarded["shared_prefix"] < forwarded["padded"] and forwarded["shared_prefix"] < forwarded["per_row"]
    )
    assert max(result["loss_rel_diff"].values()) <= 1e-5


def test_bench_batch_checkpointed_prompts_keep_less_for_backward_at_the_same_loss():
    # a long prompt under short answers, as LoCoMo's: the prompt's activations outweigh the answers' logits
    args = [*QUICK, "--prompt-min", "600", "--prompt-max", "600", "--response-max", "2", "--layers", "4"]
    args += ["--hidden", "64", "--group-size", "2"]
    result = BENCHES.get("batch")([*args, "--paths", "shared_prefix,checkpointed"])
    assert result["speedup_base"] == "shared_prefix" and set(result["saved_mb"]) == {
        "shared_prefix",
        "checkpointed",
    }
    assert result["loss_rel_diff"]["checkpointed"] <= 1e-5
    assert result["saved_mb"]["checkpointed"] < result["saved_mb"]["shared_prefix"] / 2
    assert result["peak_rss_mb"] > 0


def test_bench_batch_names_the_valid_paths(capsys):
    with pytest.raises(SystemExit):
        BENCHES.get("batch")([*QUICK, "--paths", "shared_prefix,fast"])
    assert (
        "unknown ['fast']; choose from shared_prefix, padded, per_row, checkpointed"
        in capsys.readouterr().err
    )


def test_bench_batch_refuses_an_empty_micro_batch(capsys):
    with pytest.raises(SystemExit):
        BENCHES.get("batch")([*QUICK, "--micro-batch-size", "0"])
    assert "--micro-batch-size: need >= 1, got 0" in capsys.readouterr().err
