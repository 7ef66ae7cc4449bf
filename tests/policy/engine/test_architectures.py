"""Every HF engine path against transformers, per architecture family (tiny random models, sharpened).

The reference is transformers' own ``generate`` on an eager-attention copy of the model (its sliding-window cache
layers and masks); the engine runs the same weights through ``memrl_sdpa``, its cache layers and its fast paths.
Prompts run many windows long (:data:`~memrl.testing.architectures.TINY_WINDOW` is 24 positions).
"""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from peft import PeftModel, get_peft_model

from memrl.data.batch import TrajectoryBatchBuilder
from memrl.data.config import BatchConfig
from memrl.policy.base import GenerationRequest, SamplingParams
from memrl.policy.config import PolicyConfig
from memrl.policy.engine.hf import HFPolicy
from memrl.policy.engine.sliding_window import Positions
from memrl.policy.errors import PolicyError
from memrl.testing.architectures import FAMILIES, TINY_WINDOW, random_tiny
from memrl.train.config import LoraConfig, TrainConfig
from memrl.train.lora import adapter_state, attach_lora, save_adapter
from memrl.train.updater import PolicyUpdater
from memrl.types import EpisodeStatus, EpisodeTrajectory, StepMeta, StepTrajectory

TEXT = (
    "Alice moved to Lisbon in May and started a job at the harbour office. Bob bought a red bike; Carol "
    "adopted a cat named Pixel. Later Alice said the harbour office closed and she now works at a bakery. "
) * 4
LENGTHS = (2, 17, 59, 140, 231)
NEW = 16
WINDOWED = [name for name, f in FAMILIES.items() if f.sliding_window]


class Family:
    """A family's tiny model, an eager reference copy and its byte tokenizer."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.model, self.tok = random_tiny(name)
        self.ref = copy.deepcopy(self.model)
        self.ref.set_attn_implementation("eager")

    def enc(self, text: str) -> tuple[int, ...]:
        return tuple(self.tok.encode(text, add_special_tokens=False))

    def prompts(self) -> list[tuple[int, ...]]:
        return [self.enc(TEXT[:n]) for n in LENGTHS]

    def policy(self, model=None, **cfg) -> HFPolicy:
        cfg = {"model": self.name, "seed": 0, "speculative_tokens": 0, **cfg}
        return HFPolicy.from_model(model or self.model, self.tok, PolicyConfig(**cfg))

    @torch.no_grad()
    def expected(self, prompt, n: int = NEW, model=None) -> list[int]:
        """transformers' greedy tokens (stopping at eos, as the engine does)."""
        model = model or self.ref
        out = model.generate(torch.tensor([list(prompt)]), max_new_tokens=n, do_sample=False, pad_token_id=0)
        return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models are dispatch bound: one torch thread runs them 10-40x faster than two beside another job."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=list(FAMILIES))
def fam(request) -> Family:
    return Family(request.param)


def greedy(n: int = NEW, samples: int = 1) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=n, n=samples)


def decode(policy, prompts, params=None):
    return [[list(o.token_ids) for o in outs] for outs in policy.generate(
        [GenerationRequest(p, params or greedy()) for p in prompts]
    )]  # fmt: skip


def test_batched_greedy_past_the_window_and_continued_from_the_radix_cache(fam):
    policy = fam.policy()
    prompts = fam.prompts()
    expected = [fam.expected(p) for p in prompts]
    assert [o[0] for o in decode(policy, prompts)] == expected
    assert len({tuple(e) for e in expected}) == len(prompts)  # distinct outputs: the check is not vacuous
    follow = [p + tuple(e) + fam.enc(" and then") for p, e in zip(prompts, expected, strict=True)]
    outs = policy.generate([GenerationRequest(p, greedy()) for p in follow])
    assert [list(o[0].token_ids) for o in outs] == [fam.expected(p) for p in follow]
    assert all(o[0].cached_tokens > 0 for o in outs[1:])  # continued from the cached states
    if FAMILIES[fam.name].sliding_window:
        assert max(map(len, follow)) > 9 * TINY_WINDOW


def test_shared_prefix_rows(fam, monkeypatch):
    """Samples of one prompt, and requests sharing a long cached prefix, attend to one copy of it."""
    policy = fam.policy()
    shared = []
    original = HFPolicy._shared_prefix

    def spy(self, rows):
        found = original(self, rows)
        shared.append(found is not None)
        return found

    monkeypatch.setattr(HFPolicy, "_shared_prefix", spy)
    prompt = fam.enc(TEXT[:300])
    policy.generate([GenerationRequest(prompt[:-40], greedy(1))])  # leaves the common part in the cache
    rows = [prompt, prompt[:-40] + fam.enc(" Who moved?"), prompt[:-40] + fam.enc(" Who works at a bakery?")]
    outs = decode(policy, rows, greedy(NEW, samples=2))
    for p, samples in zip(rows, outs, strict=True):
        assert samples == [fam.expected(p)] * 2
    assert any(shared)


def test_speculative_drafts_decode_as_transformers(fam, monkeypatch):
    """Drafts checked in the decode steps: right ones (transformers' own next tokens) for two rows, wrong ones
    for the third, so both the kept and the rejected columns are exercised past the window."""
    prompts = [fam.enc(TEXT[:n]) for n in (60, 180, 330)]
    expected = [fam.expected(p, 24) for p in prompts]

    def oracle(tokens, k, max_ngram=3):
        for i, (p, e) in enumerate(zip(prompts, expected, strict=True)):
            if tuple(tokens[: len(p)]) == p and len(tokens) < len(p) + len(e):
                done = len(tokens) - len(p)
                return [7] * k if i == 2 else e[done : done + k]
        return []

    monkeypatch.setattr("memrl.policy.engine.speculative.propose", oracle)
    policy = fam.policy(speculative_tokens=4)
    assert [o[0] for o in decode(policy, prompts, greedy(24))] == expected
    stats = policy.forward_stats
    assert 0 < stats["accepted_tokens"] < stats["draft_tokens"]


def test_scored_log_probs_from_a_cached_prefix_equal_a_full_forward(fam):
    """``logprobs`` / ``greedy_logprobs`` (the writer's draft check, snapshot credit) score a response after a
    prompt whose start is in the radix cache: the causal-tail path, past the window."""
    policy = fam.policy()
    prompt = fam.enc(TEXT[:260])
    policy.generate([GenerationRequest(prompt[:-30], greedy(1))])
    response = fam.enc(" Alice works at a bakery.")
    [scored] = policy.logprobs([(prompt, response)])
    with torch.no_grad():
        logits = fam.ref(torch.tensor([list(prompt + response)])).logits[0, len(prompt) - 1 : -1]
    want = torch.log_softmax(logits.float(), -1)[torch.arange(len(response)), torch.tensor(response)]
    assert torch.allclose(torch.tensor(scored), want, atol=1e-4)
    [(_, best, _)] = policy.greedy_logprobs([(prompt, response)])
    assert best == logits.argmax(-1).tolist()


def _lora(model, seed: int = 1):
    """``model`` with an all-linear LoRA adapter whose B is random (a trained adapter, not a no-op)."""
    torch.manual_seed(seed)
    cfg = PeftLoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    return get_peft_model(model, cfg).eval()


def test_lora_folded_decodes_as_the_adapter(fam):
    peft = _lora(copy.deepcopy(fam.model))
    ref = _lora(copy.deepcopy(fam.ref))
    assert any("qkv_proj" in n or "q_proj" in n for n, _ in peft.named_modules() if "lora_A" in n)
    policy = fam.policy(model=peft, merge_lora=True)
    prompts = fam.prompts()[2:]
    outs = decode(policy, prompts)
    assert [o[0] for o in outs] == [fam.expected(p, model=ref) for p in prompts]
    assert [o[0] for o in outs] != [fam.expected(p) for p in prompts]  # the adapter changes the output


def _episodes(policy, prompts) -> list[EpisodeTrajectory]:
    params = SamplingParams(temperature=1.0, max_tokens=12, n=2, seed=5)
    outs = policy.generate([GenerationRequest(p, params) for p in prompts])
    episodes = []
    for g, (prompt, samples) in enumerate(zip(prompts, outs, strict=True)):
        for k, out in enumerate(samples):
            step = StepTrajectory(
                step_id=f"g{g}e{k}",
                prompt_ids=prompt,
                response_ids=out.token_ids,
                response_mask=(1,) * len(out.token_ids),
                logprobs=out.logprobs,
                turn_id="t",
                meta=StepMeta(turn_id="t"),
            )
            episodes.append(
                EpisodeTrajectory(
                    episode_id=f"g{g}e{k}",
                    group_id=f"g{g}",
                    steps=(step,),
                    reward=float(k),
                    status=EpisodeStatus.COMPLETED,
                    sample_index=2 * g + k,
                )
            )
    return episodes


def test_sampled_logprobs_equal_the_training_forward_and_a_grpo_step_saves_and_loads(fam, tmp_path):
    """The engine's log-probs of its own samples are the training forward's (importance ratio 1 before the
    first update); one all-linear LoRA GRPO step moves the adapter; the saved adapter loads and decodes alike."""
    model = attach_lora(copy.deepcopy(fam.model), LoraConfig(r=4, alpha=8))
    policy = fam.policy(model=model)
    episodes = _episodes(policy, fam.prompts()[2:])
    batch = TrajectoryBatchBuilder(BatchConfig(layout="packed")).build(episodes)
    before = adapter_state(model)
    metrics = PolicyUpdater(model, TrainConfig(lr=1e-2, lora=LoraConfig(r=4, alpha=8))).update(batch)
    assert metrics["train/rollout_logp_abs_diff"] < 1e-4
    after = adapter_state(model)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    path = save_adapter(model, tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(copy.deepcopy(fam.ref), str(path)).eval()
    policy = fam.policy(model=copy.deepcopy(fam.model))
    policy.load_adapter(path)
    prompts = fam.prompts()[2:]
    assert [o[0] for o in decode(policy, prompts)] == [fam.expected(p, model=reloaded) for p in prompts]


@pytest.mark.parametrize("name", WINDOWED)
def test_an_engine_without_the_window_is_caught(name, monkeypatch):
    """The tiny models are sharp enough: with the window dropped (the engine before it masked by position),
    the decode of long prompts differs from transformers'."""
    fam = Family(name)
    monkeypatch.setattr(Positions, "window_mask", lambda self, window: None)
    policy = fam.policy()
    prompts = fam.prompts()
    got = [o[0] for o in decode(policy, prompts)]
    follow = [p + tuple(g) + fam.enc(" and then") for p, g in zip(prompts, got, strict=True)]
    got += [o[0] for o in decode(policy, follow)]
    expected = [fam.expected(p) for p in prompts + follow]
    assert sum(g != e for g, e in zip(got, expected, strict=True)) >= 3


@pytest.mark.parametrize(
    ("override", "feature"),
    [
        ({"attn_logit_softcapping": 50.0}, "soft-capping"),
        ({"use_bidirectional_attention": True}, "bidirectional"),
    ],
)
def test_features_the_engine_cannot_serve_are_refused_at_load(override, feature):
    model, tok = random_tiny("gemma3")
    for key, value in override.items():
        setattr(model.config, key, value)
    with pytest.raises(PolicyError, match=feature) as err:
        HFPolicy.from_model(model, tok, PolicyConfig(model="tiny-gemma3"))
    assert "policy.backend=vllm" in str(err.value) and "tiny-gemma3" in str(err.value)


def test_a_windowed_model_off_the_engine_attention_is_refused():
    model, tok = random_tiny("mistral", attn_implementation="eager")
    with pytest.raises(PolicyError, match=r"sliding-window attention \(window 24 on 2 of 2 layers\)"):
        HFPolicy.from_model(model, tok, PolicyConfig(model="tiny-mistral", attn_implementation="eager"))
