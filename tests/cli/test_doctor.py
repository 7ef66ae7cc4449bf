"""``memrl doctor MODEL``: tiny models the engine serves pass every path (exit 0), a model with a feature it does not
apply is refused (exit 2), and an engine path that writes other tokens than transformers fails (exit 1)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from memrl.cli.doctor import layer_ranges
from memrl.cli.main import main
from memrl.policy.engine import doctor
from memrl.policy.engine.hf import HFPolicy
from memrl.testing import byte_tokenizer

PATHS = [
    "plain decode",
    "radix-cache continuation",
    "padded batch",
    "shared-prefix batch",
    "speculative drafts (4)",
    "log-probs",
]


@pytest.mark.parametrize(("family", "window"), [("llama", None), ("mistral", 24)])
def test_tiny_models_pass_every_path(family, window, capsys):
    rc = main(["doctor", f"tiny:{family}", "--json", "--probe-tokens", "120" if window is None else "70"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["verdict"] == "OK" and report["exit_code"] == 0
    assert [c["path"] for c in report["checks"]] == PATHS
    assert all(c["status"] == "pass" and c["compared"] > 0 for c in report["checks"]), report["checks"]
    assert report["model_type"] == family and report["window"] == window and report["layers"] == 2
    assert report["sliding_layers"] == ([] if window is None else [0, 1])
    assert report["dtype"] == "float32" and report["device"] == "cpu" and report["parameters"] > 0
    assert report["chat_template"] and "<|assistant|>" in report["chat_preview"] and not report["adds_bos"]
    assert report["probe_tokens"] == (120 if window is None else 70) and report["refusal"] is None
    assert report["logprob_max_diff"] < report["tolerance"]


def _tiny_gemma2():
    """A Gemma 2 with attention-logit soft-capping, which the engine does not apply."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=384,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        attn_logit_softcapping=50.0,
        sliding_window=24,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    config._attn_implementation = "sdpa"
    return Gemma2ForCausalLM(config).eval(), byte_tokenizer()


def test_an_unsupported_feature_is_refused_with_exit_code_2(monkeypatch, capsys):
    model, tok = _tiny_gemma2()
    report = doctor.diagnose("tiny-gemma2", model=model, tokenizer=tok)
    assert report.verdict == "refused" and report.exit_code == 2 and report.checks == []
    assert "soft-capping" in report.refusal and report.unsupported and report.model_type == "gemma2"

    monkeypatch.setattr(doctor, "load", lambda name, dtype, device: (model, tok, "/models/gemma2"))
    assert main(["doctor", "some/gemma2"]) == 2
    out = capsys.readouterr().out
    assert "refused" in out and "soft-capping" in out and "/models/gemma2" in out


def test_a_path_that_differs_from_transformers_fails_with_exit_code_1(monkeypatch, capsys):
    generate = HFPolicy.generate

    def off_by_one(self, requests):  # the engine writes another token at index 3
        outs = generate(self, requests)
        return [[_bump(o, 3) for o in row] for row in outs]

    monkeypatch.setattr(HFPolicy, "generate", off_by_one)
    assert main(["doctor", "tiny:llama", "--json", "--probe-tokens", "120"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["verdict"] == "parity FAIL" and report["exit_code"] == 1
    by_path = {c["path"]: c for c in report["checks"]}
    assert by_path["plain decode"]["status"] == "FAIL" and by_path["plain decode"]["first_diff"] == 3
    assert "token 3: engine" in by_path["plain decode"]["detail"]
    assert by_path["log-probs"]["status"] == "FAIL"  # the engine's log-prob is not that of its token

    assert main(["doctor", "tiny:llama", "--probe-tokens", "120"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and out.rstrip().splitlines()[-1].startswith("verdict")
    assert "parity FAIL (exit code 1)" in out


def _bump(out, i):
    if len(out.token_ids) <= i:
        return out
    ids = list(out.token_ids)
    ids[i] = 3 + (ids[i] + 1 - 3) % 256  # another byte
    return dataclasses.replace(out, token_ids=tuple(ids))


def test_outputs_compare_exactly_unless_one_ended_at_eos():
    assert doctor.first_difference([5, 6, 7], [5, 6, 7], [1]) == (3, None)
    assert doctor.first_difference([5, 6, 1], [5, 6, 1], [1]) == (3, None)
    assert doctor.first_difference([5, 6], [5, 6, 7], [1]) == (3, 2)  # shorter without eos: differs
    assert doctor.first_difference([5, 1], [5, 1, 9], [1]) == (2, None)  # eos ends the comparison
    assert doctor.first_difference([5, 8, 1], [5, 6, 1], [1]) == (3, 1)


def test_the_probe_is_long_enough_for_the_window_and_fits_the_model():
    assert doctor.probe_length(None, None, 4096) == doctor.DEFAULT_PROBE
    assert doctor.probe_length(None, 24, 4096) == 85
    assert doctor.probe_length(None, 4096, 8192) == 8192 - 2 * doctor.NEW_TOKENS - 16
    assert doctor.probe_length(50, 24, 4096) == 50
    assert len(doctor.probe_ids(byte_tokenizer(), 500)) == 500
    assert layer_ranges([0, 1, 2, 4, 6, 7]) == "0-2, 4, 6-7"


def test_the_models_own_sampling_defaults_are_reported_not_applied_to_transformers_side():
    """A generation_config with a repetition penalty (Qwen2.5 ships one): memrl's engine does not apply it, and
    transformers' reference must not either, or every path would differ."""
    from memrl.testing.architectures import random_tiny

    model, tok = random_tiny("llama")
    model.generation_config.repetition_penalty = 3.0
    report = doctor.diagnose("tiny:llama", model=model, tokenizer=tok, probe_tokens=120)
    assert report.verdict == "OK", report.checks
    assert report.generation_defaults == {"repetition_penalty": 3.0}
    assert model.generation_config.repetition_penalty == 3.0  # restored after each reference generate
