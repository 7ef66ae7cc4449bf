"""``memrl bench engines``: its workloads, its summary, and an engine that cannot run reported with the reason."""

from __future__ import annotations

import pytest

from memrl.bench import BENCHES
from memrl.bench.engines import _choices, _summary, write_prompts


def test_write_prompts_are_the_writers_own_over_the_locomo_fixture(tiny_model_dir):
    from transformers import AutoTokenizer

    from memrl.templates import load_template

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompts = write_prompts(tok, 32, neighbours=4)
    assert len(prompts) == 32 and len({tuple(p) for p in prompts}) == 32  # one distinct turn per row
    text = tok.decode(prompts[0])
    assert load_template("memory_write.j2").render().strip()[:80] in text  # the writer's instructions
    memory = tok.decode(prompts[-1]).rsplit("Memory:", 1)[1].split("New:", 1)[0]
    assert [line[:3] for line in memory.strip().splitlines()] == ["0. ", "1. ", "2. ", "3. "]
    assert text.rstrip().endswith("Operations:") or "Operations:" in text.rsplit("New:", 1)[1]


def test_summary_reports_each_arms_ratio_over_hf_and_the_greedy_rows_that_agree():
    def arm(wall, rows):
        return {"workloads": {"w/greedy": {"wall_s": wall, "prompt_tokens": 10, "rows": rows, "peak_rss_mb": 1.0,
                                           "generated_tokens": sum(map(len, rows))}}}  # fmt: skip

    row = _summary(
        "w/greedy",
        {"hf": arm(2.0, [[1, 2], [3, 4], [5]]), "vllm": arm(1.0, [[1, 2], [3, 9], [5]]),
         "hf-bf16": arm(4.0, [[1, 2], [3, 4], [5]])},
    )  # fmt: skip
    assert row["rows"] == 3 and row["agree_with_hf"] == {"vllm": 2, "hf-bf16": 3}
    assert row["hf"]["tokens_per_s"] == 2.5 and row["vllm"]["tokens_per_s"] == 5.0
    assert row["over_hf"] == {"vllm": 2.0, "hf-bf16": 0.5}
    assert row["hf"]["forwarded_tokens_per_s"] == 7.5
    only = _summary("w/greedy", {"hf": arm(2.0, [[1]])})
    assert "over_hf" not in only and "agree_with_hf" not in only


def test_unknown_choices_list_the_valid_ones():
    with pytest.raises(ValueError, match="--workloads: unknown \\['writes_9'\\]; valid: writes_8, writes_32"):
        _choices("writes_9", ("writes_8", "writes_32"), "--workloads")


def test_a_missing_vllm_environment_is_reported_and_the_hf_arms_still_run(tiny_model_dir, tmp_path):
    missing = tmp_path / "no-venv" / "bin" / "python"
    out = BENCHES.get("engines")(
        ["--model", str(tiny_model_dir), "--workloads", "writes_8", "--modes", "greedy", "--threads", "1",
         "--vllm-python", str(missing), "--engines", "hf,hf-bf16,hf-plain,vllm"]
    )  # fmt: skip
    vllm = out["engines"]["vllm"]
    assert (
        vllm["available"] is False
        and f"{missing} does not exist" in vllm["reason"]
        and ".ci/vllm.sh" in vllm["reason"]
    )
    hf = out["workloads"]["writes_8/greedy"]["hf"]
    assert hf["generated_tokens"] > 0 and hf["wall_s"] > 0 and hf["peak_rss_mb"] > 100
    assert out["engines"]["hf"]["available"] and out["engines"]["hf"]["transformers"]
    row = out["workloads"]["writes_8/greedy"]
    assert "vllm" not in row and "vllm" not in out["faster_than_hf"]
    # the bf16 arm ran the HF engine in bfloat16, on the same prompts
    assert out["engines"]["hf"]["dtype"] == "float32" and out["engines"]["hf-bf16"]["dtype"] == "bfloat16"
    assert row["hf-bf16"]["prompt_tokens"] == hf["prompt_tokens"] and row["hf-bf16"]["generated_tokens"] > 0
    assert (
        set(row["over_hf"]) == {"hf-bf16", "hf-plain"}
        and 0 <= row["agree_with_hf"]["hf-bf16"] <= row["rows"] == 8
    )
    # the plain arm decoded without speculation, to the same float32 greedy rows
    assert (
        out["engines"]["hf"]["speculative_tokens"] > 0
        and out["engines"]["hf-plain"]["speculative_tokens"] == 0
    )
    assert row["agree_with_hf"]["hf-plain"] == 8


def test_a_failed_arm_reports_the_root_cause_before_the_clients_last_words():
    from memrl.bench.engines import arm_failure

    stderr = "\n".join(
        ["INFO start", "(EngineCore) ValueError: the root cause", *[f"  frame {i}" for i in range(20)],
         "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue."]
    )  # fmt: skip
    said = arm_failure(stderr, tail=3)
    assert said.splitlines()[0] == "(EngineCore) ValueError: the root cause"
    assert said.splitlines()[-1].startswith("vllm.v1.engine.exceptions.EngineDeadError")
    assert "INFO start" not in said and "frame 5" not in said
