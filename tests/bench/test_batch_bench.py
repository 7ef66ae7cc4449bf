from __future__ import annotations

import pytest

from memrl.bench import BENCHES

QUICK = ["--groups", "2", "--group-size", "3", "--prompt-min", "20", "--prompt-max", "40"]
QUICK += ["--response-max", "8", "--layers", "1", "--hidden", "32", "--repeats", "1", "--threads", "1"]


def test_bench_batch_times_every_train_layout_on_the_same_tokens():
    result = BENCHES.get("batch")(QUICK)
    assert result["speedup_base"] == "padded" and result["cpu_speedup"]["padded"] == 1.0
    assert (
        set(result["speedup"]) == {"shared_prefix", "packed", "padded"} and result["speedup"]["padded"] == 1.0
    )
    assert result["num_sequences"] == 6
    assert result["loss_rel_diff"] <= 1e-5  # the same tokens, the same model: the same summed loss
    assert all(loss > 0 for loss in result["losses"].values())
    forwarded = result["forwarded_tokens"]
    # shared_prefix forwards each group's prompt once; packed exactly the real tokens; padded adds padding
    assert forwarded["shared_prefix"] < forwarded["packed"] == result["real_tokens"] <= forwarded["padded"]
    assert result["micro_batches"]["shared_prefix"] == 2  # one per group of 3 ≤ micro_batch_size


def test_bench_batch_names_an_unknown_layout(capsys):
    with pytest.raises(SystemExit):
        BENCHES.get("batch")([*QUICK, "--layouts", "shared_prefix,bins"])
    assert "unknown ['bins']; choose from shared_prefix, packed, padded" in capsys.readouterr().err
