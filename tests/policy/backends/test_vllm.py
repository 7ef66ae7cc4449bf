"""The vLLM backend on a random tiny Llama saved to disk, against the HF backend on the same weights.

Runs only with ``-m vllm`` in the vllm environment (``.ci/vllm.sh``); engine start + compile take ~1 minute.
"""

from __future__ import annotations

import contextlib
import tempfile

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from memrl.policy import make_policy  # noqa: E402
from memrl.policy.base import GenerationRequest, SamplingParams  # noqa: E402
from memrl.policy.config import PolicyConfig  # noqa: E402
from memrl.policy.engine.hf import HFPolicy  # noqa: E402
from memrl.testing import random_tiny_llama  # noqa: E402
from memrl.testing.architectures import FAMILIES, fast_byte_tokenizer, random_tiny  # noqa: E402
from memrl.types import FinishReason  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    # head_dim 32: the smallest head size vLLM's CPU attention supports.
    model, tok = random_tiny_llama(
        seed=4, num_attention_heads=2, num_key_value_heads=1, initializer_range=0.3
    )
    path = tmp_path_factory.mktemp("tiny-vllm")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def pair(model_dir):
    with _vllm_env():
        cfg = PolicyConfig(backend="vllm", model=str(model_dir), max_model_len=1024, vllm_kv_cache_gb=1)
        vllm_policy = make_policy(cfg)
        hf_policy = HFPolicy(PolicyConfig(model=str(model_dir)))
        yield hf_policy, vllm_policy
        vllm_policy.close()  # before the temp dir goes, and not at interpreter exit (see VLLMPolicy.close)


@contextlib.contextmanager
def _vllm_env():
    """The engine's ZMQ IPC sockets (VLLM_RPC_BASE_PATH, default: the temp dir), its compile cache (~/.cache/vllm)
    and inductor's (/tmp/torchinductor_<user>, GBs over many runs) in a directory deleted afterwards, so the tests
    leave nothing behind."""
    with tempfile.TemporaryDirectory(prefix="memrl-vllm-") as tmp, pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_RPC_BASE_PATH", tmp)
        mp.setenv("VLLM_CACHE_ROOT", f"{tmp}/vllm-cache")
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", f"{tmp}/inductor")
        mp.setenv("TMPDIR", tmp)  # the engine process's own temp files (e.g. inductor's precompiled headers)
        yield


def enc(policy, text):
    return tuple(policy.tokenizer.encode(text, add_special_tokens=False))


def test_vllm_greedy_matches_hf(pair):
    hf, vl = pair
    prompts = [enc(hf, "Where does Ann live?"), enc(hf, "x" * 40)]
    params = SamplingParams(temperature=0.0, max_tokens=12, top_logprobs=3)
    want = hf.generate([GenerationRequest(p, params) for p in prompts])
    got = vl.generate([GenerationRequest(p, params) for p in prompts])
    for [w], [g] in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids and g.finish_reason is FinishReason.LENGTH
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-3)
        assert [list(t) for t in g.top_logprobs] == [list(t) for t in w.top_logprobs]


def test_greedy_with_several_samples_runs_each_as_its_own_row(pair):
    """vLLM refuses n > 1 at temperature 0; the backend sends n single rows (a greedy chain of 8 leaves)."""
    hf, vl = pair
    prompt = enc(hf, "Where does Ann live?")
    params = SamplingParams(temperature=0.0, max_tokens=8, n=3)
    [want] = hf.generate([GenerationRequest(prompt, params)])
    [got, single] = vl.generate(
        [
            GenerationRequest(prompt, params),
            GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=8)),
        ]
    )
    assert len(got) == 3 and len(single) == 1
    assert [g.token_ids for g in got] == [w.token_ids for w in want] == [single[0].token_ids] * 3


def test_vllm_stops_prefix_cache_and_scoring(pair):
    hf, vl = pair
    prompt = enc(hf, "Bob bought a red bike. " * 8)
    [[ref]] = hf.generate([GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=20))])
    stop_id = ref.token_ids[3]
    params = SamplingParams(temperature=0.0, max_tokens=20, stop_token_ids=(stop_id,))
    [[first]] = vl.generate([GenerationRequest(prompt, params)])
    assert first.token_ids == ref.token_ids[: ref.token_ids.index(stop_id) + 1]
    assert first.finish_reason is FinishReason.STOP and first.stop_reason == stop_id
    cont = prompt + first.token_ids
    [[second]] = vl.generate([GenerationRequest(cont, SamplingParams(temperature=0.0, max_tokens=4))])
    assert second.cached_tokens > 0  # vLLM's automatic prefix caching served the shared prefix
    pairs = [(prompt, ref.token_ids[:8])]
    assert torch.allclose(torch.tensor(vl.logprobs(pairs)[0]), torch.tensor(hf.logprobs(pairs)[0]), atol=1e-3)


# vLLM's CPU attention needs head_dim >= 32: two query heads of 32 over one key/value head.
WIDE_HEADS = {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_vllm_decodes_each_family_as_the_hf_engine(family, tmp_path):
    """The same tiny model of each family through both backends, prompts many sliding windows long: greedy
    tokens equal, log-probs within float32 noise."""
    model, _ = random_tiny(family, seed=4, **WIDE_HEADS)
    model.save_pretrained(tmp_path)
    fast_byte_tokenizer().save_pretrained(tmp_path)  # loads under every family's tokenizer class
    hf = HFPolicy(PolicyConfig(model=str(tmp_path), dtype="float32"))
    text = "Alice moved to Lisbon in May; Bob bought a red bike. " * 6
    prompts = [enc(hf, text[:n]) for n in (9, 70, 300)]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    want = hf.generate([GenerationRequest(p, params) for p in prompts])
    with _vllm_env():
        vl = make_policy(
            PolicyConfig(
                backend="vllm", model=str(tmp_path), dtype="float32", max_model_len=1024, vllm_kv_cache_gb=1
            )
        )
        try:
            got = vl.generate([GenerationRequest(p, params) for p in prompts])
        finally:
            vl.close()
    for [w], [g] in zip(want, got, strict=True):
        assert g.token_ids == w.token_ids
        assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-3)


@pytest.fixture(scope="module")
def per_role(tmp_path_factory):
    """A tiny Llama (vLLM-sized heads) with the two roles' adapters saved as a per-role run publishes them; the
    answer and writer adapters perturbed differently, so the roles decode differently."""
    from memrl.train.config import LoraConfig
    from memrl.train.lora import attach_lora, save_adapter

    model, tok = random_tiny_llama(
        seed=4, num_attention_heads=2, num_key_value_heads=1, initializer_range=0.3
    )
    base = tmp_path_factory.mktemp("tiny-per-role")
    model.save_pretrained(base)
    tok.save_pretrained(base)
    model = attach_lora(model, LoraConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]), per_role=True)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * (0.5 if ".memory." in name else 0.2))
    adapter = save_adapter(model.eval(), base / "adapter")
    hf = HFPolicy(PolicyConfig(model=str(base), dtype="float32", lora_path=str(adapter)))
    with _vllm_env():
        vl = make_policy(
            PolicyConfig(
                backend="vllm", model=str(base), dtype="float32", max_model_len=1024, vllm_kv_cache_gb=1,
                lora_path=str(adapter),
            )
        )  # fmt: skip
        yield hf, vl, adapter
        vl.close()


def test_each_role_decodes_with_its_own_adapter_as_the_hf_engine(per_role):
    hf, vl, _ = per_role
    prompts = [enc(hf, "Where does Ann live?"), enc(hf, "Bob bought a red bike. " * 3)]
    params = SamplingParams(temperature=0.0, max_tokens=12)
    reqs = [GenerationRequest(p, params) for p in prompts]
    out = {}
    for role in ("default", "memory"):
        with hf.use_adapter(role), vl.use_adapter(role):
            out[role] = (hf.generate(reqs), vl.generate(reqs))
    for role, (want, got) in out.items():
        for [w], [g] in zip(want, got, strict=True):
            assert g.token_ids == w.token_ids, role
            assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(w.logprobs), atol=1e-3), role
    assert [o[0].token_ids for o in out["default"][1]] != [o[0].token_ids for o in out["memory"][1]]


def test_draft_check_and_digest_through_the_contract(per_role):
    """greedy_logprobs gives HF's argmax and log-probs on a draft that departs from greedy; the digest follows
    the role's adapter files and changes when new weights are published."""
    import shutil

    hf, vl, adapter = per_role
    prompt = enc(hf, "Where does Ann live?")
    with hf.use_adapter("memory"), vl.use_adapter("memory"):
        [[w]] = hf.generate([GenerationRequest(prompt, SamplingParams(temperature=0.0, max_tokens=10))])
        draft = w.token_ids[:5] + ((w.token_ids[5] + 1) % 200,) + w.token_ids[6:]
        other = enc(hf, "Bob bought a red bike. " * 3)  # several prompts in one call: each scored on its own
        want = hf.greedy_logprobs([(prompt, draft), (other, draft)])
        got = vl.greedy_logprobs([(prompt, draft), (other, draft)])
        pairs = [(prompt, w.token_ids), (other, w.token_ids[:4])]
        assert all(
            torch.allclose(torch.tensor(g), torch.tensor(w_), atol=1e-3)
            for g, w_ in zip(vl.logprobs(pairs), hf.logprobs(pairs), strict=True)
        )
    assert got[1][1] == want[1][1]
    (w_lps, w_greedy, w_glps), (g_lps, g_greedy, g_glps) = want[0], got[0]
    assert g_greedy == w_greedy and g_greedy[:5] == list(draft[:5]) and g_greedy[5] != draft[5]
    assert torch.allclose(torch.tensor(g_lps), torch.tensor(w_lps), atol=1e-3)
    assert torch.allclose(torch.tensor(g_glps), torch.tensor(w_glps), atol=1e-3)
    memory, answer = vl.weights_digest("memory"), vl.weights_digest("default")
    assert memory != answer and vl.weights_digest("absent") == answer
    shutil.copytree(adapter, adapter.parent / "republished")  # the same weights published anew: same digest
    vl.load_adapter(adapter.parent / "republished")
    assert vl.weights_digest("memory") == memory
