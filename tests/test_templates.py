"""encode_chat through each model family's official chat template: where the system text lands, the generation
prompt, the fold into the first user message where a template rejects or drops the system role, and the plain
format (bos where the tokenizer adds one, never an eos) for base models without a template.

The templates in tests/fixtures/chat_templates/ are the official ones, from each model's tokenizer_config.json:
llama3_1 (meta-llama/Llama-3.1-8B-Instruct, also 3.3), llama3_2 (Llama-3.2-1B/3B-Instruct), qwen2_5
(Qwen/Qwen2.5-*-Instruct), smollm2 (HuggingFaceTB/SmolLM2-*-Instruct), mistral_v0_3
(mistralai/Mistral-7B-Instruct-v0.3), phi3_mini (microsoft/Phi-3-mini-4k-instruct since its July 2024 update),
phi3_mini_2404 (its first, April 2024 template: drops the system message), gemma2 (google/gemma-2-*-it: raises
on the system role), gemma3 (google/gemma-3-*-it: folds the system text into the first user turn). They sit on a
byte-level BPE tokenizer built here (every byte one token, the family's special tokens added), so no download.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import ByT5Tokenizer, PreTrainedTokenizerFast

from memrl import templates
from memrl.templates import PLAIN_CHAT_FORMAT, ChatTemplateError, encode_chat, fold_system, render_chat
from memrl.testing.models import byte_tokenizer

FIXTURES = Path(__file__).parent / "fixtures" / "chat_templates"

SYSTEM = "Known facts:\n- [2023-05-01] Ann lives in Oslo\nAnswer in a few words."
USER = "Where does Ann live?"
MESSAGES = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]

# Per family: the tokenizer's bos / eos and the markers its template writes (added as special tokens).
FAMILIES = {
    "llama3_1": ("<|begin_of_text|>", "<|eot_id|>", ["<|start_header_id|>", "<|end_header_id|>"]),
    "llama3_2": ("<|begin_of_text|>", "<|eot_id|>", ["<|start_header_id|>", "<|end_header_id|>"]),
    "qwen2_5": (None, "<|im_end|>", ["<|im_start|>", "<|endoftext|>"]),
    "smollm2": ("<|im_start|>", "<|im_end|>", ["<|endoftext|>"]),
    "mistral_v0_3": ("<s>", "</s>", ["[INST]", "[/INST]"]),
    "phi3_mini": ("<s>", "<|endoftext|>", ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]),
    "phi3_mini_2404": ("<s>", "<|endoftext|>", ["<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]),
    "gemma2": ("<bos>", "<eos>", ["<start_of_turn>", "<end_of_turn>"]),
    "gemma3": ("<bos>", "<eos>", ["<start_of_turn>", "<end_of_turn>"]),
}


def _byte_bpe() -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _tokenizer(bos=None, eos=None, specials=(), template=None, **kwargs) -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(
        tokenizer_object=_byte_bpe(),
        bos_token=bos,
        eos_token=eos,
        clean_up_tokenization_spaces=False,
        **kwargs,
    )
    if specials:
        tok.add_special_tokens({"additional_special_tokens": list(specials)})
    tok.chat_template = template
    return tok


def family(name: str) -> PreTrainedTokenizerFast:
    bos, eos, specials = FAMILIES[name]
    template = (FIXTURES / f"{name}.jinja").read_text(encoding="utf-8")
    return _tokenizer(bos, eos, specials, template, name_or_path=f"test/{name}")


def rendered(tok, messages=MESSAGES) -> str:
    """encode_chat's ids as text, checked to be the rendered text's ids (special tokens whole)."""
    ids = encode_chat(tok, messages)
    text = tok.decode(ids)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert text == render_chat(tok, messages)
    return text


LLAMA3_TAIL = (
    f"{SYSTEM}<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n{USER}<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
CHATML = (
    f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{USER}<|im_end|>\n<|im_start|>assistant\n"
)
GEMMA_FOLDED = f"<bos><start_of_turn>user\n{SYSTEM}\n\n{USER}<end_of_turn>\n<start_of_turn>model\n"
# Where each family's official template puts the system text (after the fold, where there is one).
EXPECTED = {
    "llama3_1": (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n" + LLAMA3_TAIL
    ),
    "qwen2_5": CHATML,
    "smollm2": CHATML,
    "mistral_v0_3": f"<s>[INST] {SYSTEM}\n\n{USER}[/INST]",
    "phi3_mini": f"<|system|>\n{SYSTEM}<|end|>\n<|user|>\n{USER}<|end|>\n<|assistant|>\n",
    "phi3_mini_2404": f"<s><|user|>\n{SYSTEM}\n\n{USER}<|end|>\n<|assistant|>\n",  # dropped: folded
    "gemma2": GEMMA_FOLDED,  # raised: folded
    "gemma3": GEMMA_FOLDED,  # the template's own fold, the same text
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_family_renders_the_system_text_with_a_generation_prompt(name):
    assert rendered(family(name)) == EXPECTED[name]


def test_llama3_2_dates_the_system_header_today():
    text = rendered(family("llama3_2"))
    head = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    pattern = re.escape(head) + r"Today Date: \d\d [A-Z][a-z]{2} \d{4}\n\n" + re.escape(LLAMA3_TAIL)
    assert re.fullmatch(pattern, text), text


def test_ids_start_with_the_bos_the_template_writes_and_end_on_the_generation_prompt():
    tok = family("gemma2")
    ids = encode_chat(tok, MESSAGES)
    assert ids[0] == tok.bos_token_id and ids.count(tok.bos_token_id) == 1 and tok.eos_token_id not in ids
    tail = tok("<start_of_turn>model\n", add_special_tokens=False)["input_ids"]
    assert tail[0] == tok.convert_tokens_to_ids("<start_of_turn>") and ids[-len(tail) :] == tail
    # The same ids as the template's own tokenization of the folded conversation.
    folded = tok.apply_chat_template(fold_system(MESSAGES), add_generation_prompt=True)["input_ids"]
    assert ids == folded


def test_without_a_system_message_the_template_renders_as_is_qwen_and_smollm2_defaults():
    only_user = [{"role": "user", "content": USER}]
    assert rendered(family("qwen2_5"), only_user) == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{USER}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert rendered(family("smollm2"), only_user) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        f"<|im_start|>user\n{USER}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert rendered(family("gemma2"), only_user) == (
        f"<bos><start_of_turn>user\n{USER}<end_of_turn>\n<start_of_turn>model\n"
    )


def test_an_empty_user_message_still_carries_the_system_text():
    # memrl.episode.recent measures the prompt with an empty question.
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ""}]
    assert rendered(family("gemma2"), messages) == (
        f"<bos><start_of_turn>user\n{SYSTEM}<end_of_turn>\n<start_of_turn>model\n"
    )
    assert rendered(family("qwen2_5"), messages).startswith(f"<|im_start|>system\n{SYSTEM}<|im_end|>\n")


def test_mistral_drops_the_system_text_when_a_user_message_is_not_last_and_it_is_folded():
    messages = [*MESSAGES, {"role": "assistant", "content": "Oslo."}]
    tok = family("mistral_v0_3")
    assert SYSTEM not in tok.apply_chat_template(messages, tokenize=False)
    assert render_chat(tok, messages) == f"<s>[INST] {SYSTEM}\n\n{USER}[/INST] Oslo.</s>"


def test_the_outcome_is_logged_once_per_tokenizer(caplog):
    caplog.set_level(logging.INFO, logger="memrl.templates")
    outcomes = {"gemma2": "raised on the system role", "phi3_mini_2404": "drops the system text"}
    outcomes["llama3_1"] = "renders the system message in place"
    for name, what in outcomes.items():
        tok = family(name)
        caplog.clear()
        for _ in range(3):
            encode_chat(tok, MESSAGES)
        lines = [r.getMessage() for r in caplog.records if r.name == "memrl.templates"]
        assert len(lines) == 1 and what in lines[0] and f"test/{name}" in lines[0], lines
        assert all(r.levelno == logging.INFO for r in caplog.records)


def test_a_template_that_loses_the_system_text_even_folded_is_an_error_naming_the_tokenizer():
    # Keeps only each message's last 20 characters: the system text goes whether in its own message or folded.
    template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content[-20:] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    tok = _tokenizer("<bos>", "<eos>", template=template, name_or_path="test/lossy")
    with pytest.raises(ChatTemplateError, match=r"test/lossy.*even folded"):
        encode_chat(tok, MESSAGES)


def test_a_template_error_unrelated_to_the_system_role_still_raises():
    tok = family("gemma2")
    bad = [*MESSAGES, {"role": "user", "content": "hi"}]
    with pytest.raises(Exception, match="alternate"):
        encode_chat(tok, bad)
    with pytest.raises(Exception, match="alternate"):  # no system message: the template's own error
        encode_chat(tok, [{"role": "assistant", "content": "hi"}])


def test_a_user_message_quoting_the_system_text_does_not_hide_a_drop():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Be brief."}]
    text = render_chat(family("phi3_mini_2404"), messages)
    assert text == "<s><|user|>\nBe brief.\n\nBe brief.<|end|>\n<|assistant|>\n"


def test_fold_system():
    assert fold_system(MESSAGES) == [{"role": "user", "content": f"{SYSTEM}\n\n{USER}"}]
    assert fold_system([{"role": "system", "content": "S"}]) == [{"role": "user", "content": "S"}]
    assert fold_system([{"role": "system", "content": ""}, {"role": "user", "content": "U"}]) == [
        {"role": "user", "content": "U"}
    ]


# Base models: the plain format.


def _plain_ids(tok) -> list[int]:
    return tok(PLAIN_CHAT_FORMAT.format(system=SYSTEM, user=USER), add_special_tokens=False)["input_ids"]


def test_plain_format_puts_bos_first_where_the_tokenizer_adds_it_and_never_an_eos():
    # A Gemma 3 base tokenizer: bos added, as its converted tokenizer says (add_bos_token).
    tok = _tokenizer("<bos>", "<eos>", add_bos_token=True)
    assert not tok.chat_template and tok(USER)["input_ids"][0] == tok.bos_token_id
    ids = encode_chat(tok, MESSAGES)
    assert ids == [tok.bos_token_id, *_plain_ids(tok)]
    assert tok.decode(ids) == "<bos>" + PLAIN_CHAT_FORMAT.format(system=SYSTEM, user=USER)
    # With eos added too, the prompt still does not end on it.
    tok = _tokenizer("<bos>", "<eos>", add_bos_token=True, add_eos_token=True)
    assert tok(USER)["input_ids"][-1] == tok.eos_token_id
    assert encode_chat(tok, MESSAGES) == [tok.bos_token_id, *_plain_ids(tok)]


def test_plain_format_follows_a_post_processor_that_adds_bos():
    # Llama 3's tokenizer.json adds <|begin_of_text|> by its post-processor, with no add_bos_token set.
    raw = _byte_bpe()
    raw.add_special_tokens(["<|begin_of_text|>"])
    bos = raw.token_to_id("<|begin_of_text|>")
    raw.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos)],
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>"
    )
    assert not tok.add_bos_token and tok(USER)["input_ids"][0] == bos
    assert encode_chat(tok, MESSAGES) == [bos, *_plain_ids(tok)]


def test_plain_format_without_bos_where_the_tokenizer_does_not_add_it():
    tok = _tokenizer("<bos>", "<eos>")
    assert tok(USER)["input_ids"][0] != tok.bos_token_id
    assert encode_chat(tok, MESSAGES) == _plain_ids(tok)


def test_plain_format_with_the_byte_tokenizer_appends_no_eos():
    tok = ByT5Tokenizer()  # no bos; appends eos (id 1) with special tokens on
    assert tok(USER)["input_ids"][-1] == tok.eos_token_id == 1
    ids = encode_chat(tok, MESSAGES)
    assert ids == _plain_ids(tok) and ids[-1] != tok.eos_token_id
    assert tok.decode(ids) == PLAIN_CHAT_FORMAT.format(system=SYSTEM, user=USER)


def test_the_repo_byte_tokenizer_template_keeps_the_system_message():
    tok = byte_tokenizer()
    assert (
        tok.decode(encode_chat(tok, MESSAGES)) == f"<|system|>\n{SYSTEM}\n<|user|>\n{USER}\n<|assistant|>\n"
    )


def test_logging_state_is_per_tokenizer():
    a, b = family("gemma2"), family("gemma2")
    encode_chat(a, MESSAGES)
    assert templates._logged.get(a) and not templates._logged.get(b)


def test_a_package_ships_its_own_template_by_package_colon_file():
    from memrl.templates import load_template, template_source

    assert "<memories>" in template_source("memrl.methods.memory_r1:answer.j2")
    assert "Rewrite the memory" in load_template("memrl.methods.memagent:write.j2").render()
    with pytest.raises(FileNotFoundError, match="package 'memrl.methods.memagent' has no file 'nope.j2'"):
        template_source("memrl.methods.memagent:nope.j2")
    with pytest.raises(FileNotFoundError, match="no package 'no_such_pkg'"):
        template_source("no_such_pkg:answer.j2")
