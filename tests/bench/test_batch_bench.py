from __future__ import annotations

from memrl.bench import BENCHES


def test_bench_batch_reports_padding_speed_and_loss_agreement():
    result = BENCHES.get("batch")(["--steps", "8", "--layers", "1", "--hidden", "32", "--repeats", "1"])
    for key in ("padding_fraction_padded", "padding_fraction_packed", "packed_speedup", "loss_rel_diff"):
        assert key in result
    assert result["num_steps"] == 8
    assert 0.0 <= result["padding_fraction_packed"] < result["padding_fraction_padded"] < 1.0
    assert result["padding_fraction_packed_layout"] == 0.0
    assert result["padded_shape"][0] == 8 and result["real_tokens"] < 8 * result["padded_shape"][1]
    assert result["loss_rel_diff"] <= 1e-5  # the same tokens, the same model: the same summed loss
    assert result["loss_padded"] > 0 and result["packed_speedup"] > 0
