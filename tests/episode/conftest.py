"""Shared fixtures: a random-init tiny byte-level Llama saved to disk (real HF forward passes, no download)."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The role-marker shape of memrl.testing.CHAT_TEMPLATE: plain markers, generation after <|assistant|>.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory) -> str:
    import torch
    from transformers import ByT5Tokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    tok = ByT5Tokenizer()
    tok.chat_template = TINY_CHAT_TEMPLATE
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def _ray_processes() -> set[int]:
    import subprocess

    out = subprocess.run(["pgrep", "-f", "ray::|raylet|gcs_server"], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


@pytest.fixture
def ray_local(monkeypatch):
    """A local Ray (2 CPUs) whose files live in a temp dir; afterwards: no Ray process, no file in ~/.ray or
    /tmp/ray left behind."""
    import shutil
    import tempfile
    import time
    from pathlib import Path

    ray = pytest.importorskip("ray")
    home_ray, tmp_ray = Path.home() / ".ray", Path("/tmp/ray")
    home_before = set(home_ray.rglob("*")) if home_ray.exists() else set()
    tmp_before = set(tmp_ray.rglob("*")) if tmp_ray.exists() else set()
    before = _ray_processes()
    temp_dir = tempfile.mkdtemp(prefix="memrl-ray-")
    monkeypatch.setenv("RAY_TMPDIR", temp_dir)
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # token auth would write ~/.ray/auth_token
    ray.init(num_cpus=2, include_dashboard=False, _temp_dir=temp_dir, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
        for _ in range(50):  # raylet/gcs exit asynchronously after shutdown
            if not (_ray_processes() - before):
                break
            time.sleep(0.2)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not (_ray_processes() - before), "ray processes left behind"
    assert not os.path.exists(temp_dir)
    home_after = set(home_ray.rglob("*")) if home_ray.exists() else set()
    assert home_after <= home_before, f"new files in ~/.ray: {sorted(home_after - home_before)[:3]}"
    tmp_after = set(tmp_ray.rglob("*")) if tmp_ray.exists() else set()
    assert tmp_after <= tmp_before, "new files in /tmp/ray"
