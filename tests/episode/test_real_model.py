"""The main job on the embedded SmolLM2-135M-Instruct: its answers come from memory (a real forward pass, real
MiniLM + FAISS retrieval). Few episodes, one model load per test run (the session fixture)."""

from __future__ import annotations


def test_smollm2_answers_from_memory_and_strict_em_needs_the_tag(smollm2_policy, smollm2_dir, tmp_path):
    from memrl.config import load_config
    from memrl.episode.evaluate import evaluate_ablations

    cfg = load_config(
        "configs/synthetic.yaml",
        [
            f"policy.model={smollm2_dir}",
            f"output_dir={tmp_path}",
            "data.split=train",  # the test split stays for the published numbers
            "data.options={num_episodes: 8}",
            "tools.enabled=[]",
            "rollout.max_response_tokens=24",
            "episode.batch_size=8",
            "episode.record_history_turns=false",
        ],
    )
    report = evaluate_ablations(cfg, policy=smollm2_policy, progress=False)
    mem, bare = report["ablations"]["memory"], report["ablations"]["no_memory"]
    assert mem["episodes"] == bare["episodes"] == 8 and mem["failed"] == bare["failed"] == 0
    # The retrieved facts carry the answers: content accuracy rises with memory.
    assert mem["lenient_match"] > bare["lenient_match"], (mem, bare)
    assert mem["token_f1"] > bare["token_f1"]
    # Strict EM never exceeds the share of tagged answers (and lenient credits any right content).
    for ab in (mem, bare):
        assert ab["exact_match"] <= ab["answer_tag"] and ab["exact_match"] <= ab["lenient_match"]
    assert report["policy"]["model"] == str(smollm2_dir) and report["policy"]["dtype"] in (
        "bfloat16",
        "float32",
    )
