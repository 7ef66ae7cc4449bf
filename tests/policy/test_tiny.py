"""The embedded tiny model's SFT data, cache and build (a micro recipe: seconds, not the real build)."""

from __future__ import annotations

import dataclasses
import json
import random

import pytest
import torch

from memrl.policy.tiny import (
    TinyRecipe,
    arithmetic_tool,
    ensure_tiny_model,
    make_sft_examples,
    tiny_model_dir,
)
from memrl.policy.tiny_arch import byte_tokenizer
from memrl.policy.tiny_data import FactOptions, choose_facts

MICRO = TinyRecipe(
    train_episodes=12,
    eval_episodes=3,
    hidden_size=32,
    num_layers=1,
    num_heads=1,
    intermediate_size=32,
    steps=2,
    batch_size=2,
    warmup_steps=1,
    bpe_vocab_size=400,
)


def test_sft_examples_follow_the_prompt_and_response_contract():
    from memrl.episode.prompt import encode_chat

    tok = byte_tokenizer()
    examples = make_sft_examples(MICRO, tok)
    assert len(examples) == MICRO.train_episodes
    for ex in examples:
        text = tok.decode(ex.prompt_ids)
        assert text.startswith("<|system|>\n") and text.endswith("<|user|>\n" + text.split("<|user|>\n")[1])
        assert ex.response_ids[-1] == tok.eos_token_id and ex.response_mask[-1] == 1
        resp = tok.decode([t for t in ex.response_ids[:-1]])
        assert resp.endswith("</answer>") and resp.count("<answer>") == 1
        masked_out = tok.decode([t for t, m in zip(ex.response_ids, ex.response_mask, strict=True) if m == 0])
        if "<python>" in resp:
            assert masked_out.startswith(" <result>") and masked_out.endswith("</result>")
        else:
            assert masked_out == ""
    # The prompt is exactly what the episode pipeline's chat encoding gives for [system, user].
    first = examples[0]
    system, user = tok.decode(first.prompt_ids).split("<|system|>\n")[1].split("\n<|user|>\n")
    ids = encode_chat(
        tok,
        [
            {"role": "system", "content": system},
            {"role": "user", "content": user.rstrip("\n").removesuffix("\n<|assistant|>")},
        ],
    )
    assert tuple(ids) == first.prompt_ids


def test_facts_hold_gold_oldest_first_and_can_leave_it_out():
    from memrl.data.adapters import run_adapter

    episodes, _ = run_adapter("synthetic", None, split="test", options={"num_episodes": 6, "seed": 3})
    opts = FactOptions(min_distractors=2, max_distractors=3)
    for ep in episodes:
        gold = set(ep.metadata["evidence_turn_ids"])
        with_gold = choose_facts(ep, random.Random(0), opts)
        without = choose_facts(ep, random.Random(0), opts, with_gold=False)
        ids = [f["source_ids"][0] for f in with_gold]
        order = [t.turn_id for t in ep.history]
        assert gold <= set(ids) and ids == sorted(ids, key=order.index)
        assert not gold & {f["source_ids"][0] for f in without}
        assert all(f["text"].split(": ", 1)[0] for f in with_gold)  # "{speaker}: {text}"


def test_follow_up_questions_answer_the_latest_shown_value():
    from memrl.policy.tiny_data import follow_up_questions

    def fact(text):
        return {"text": f"Ada: {text}"}

    facts = [
        fact("Mia lives in Oslo."),
        fact("I saw Omar at the market."),
        fact("Mia's pet is called Rex."),
        fact("Mia now lives in Lima."),
        fact("Omar is 40 years old."),
    ]
    qas = dict(follow_up_questions(facts, "What is the name of Mia's pet?", random.Random(0), 5))
    assert qas == {
        "Which city does Mia live in?": [("<answer>Lima</answer>", 1)],  # the later, updated value
        "How old is Omar?": [("<answer>40</answer>", 1)],
    }  # the question already asked is not repeated; chit-chat asks nothing
    assert len(follow_up_questions(facts, "", random.Random(0), 1)) == 1


def test_follow_ups_extend_the_response_as_chat_turns_with_masked_questions():
    tok = byte_tokenizer()
    recipe = dataclasses.replace(MICRO, train_episodes=20, follow_ups=3)
    examples = make_sft_examples(recipe, tok)
    base = make_sft_examples(MICRO, tok)
    assert any(tok.decode(e.response_ids).count("<answer>") > 1 for e in examples)
    for ex in examples:
        text = tok.decode(ex.response_ids)
        turns = text.split("</s>")[:-1]
        assert 1 <= len(turns) <= 4 and text.endswith("</s>")
        for turn in turns[1:]:
            assert turn.startswith("\n<|user|>\n") and "\n<|assistant|>\n<answer>" in turn
        trained = tok.decode([t for t, m in zip(ex.response_ids, ex.response_mask, strict=True) if m])
        assert "<|user|>" not in trained and trained.count("<answer>") == len(turns)
    # Follow-ups come after the first exchange: the first example's prompt is the one built without them.
    assert examples[0].prompt_ids == base[0].prompt_ids


def test_arithmetic_tool_runs_only_integer_prints():
    assert arithmetic_tool("print(19 + 5)") == "24"
    assert arithmetic_tool("print(288 - 111 * 2)") == str(288 - 222)
    assert arithmetic_tool("import os").startswith("Error")
    assert arithmetic_tool("print(__import__('os'))").startswith("Error")


def test_micro_build_is_cached_deterministic_and_loadable(tmp_path, monkeypatch):
    from memrl.policy.config import PolicyConfig
    from memrl.policy.hf import HFPolicy

    monkeypatch.setenv("MEMRL_TINY_THREADS", "1")
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path / "a"))
    path = ensure_tiny_model(MICRO)
    assert path == tiny_model_dir(MICRO) and path.parent == tmp_path / "a"
    metrics = json.loads((path / "metrics.json").read_text())
    assert len(metrics["losses"]) == MICRO.steps
    assert 0.0 <= metrics["eval/em_with_gold_facts"] <= 1.0
    kinds = metrics["eval/em_with_gold_facts_by_answer_kind"]
    assert set(kinds) <= {"number", "word"} and all(0.0 <= v <= 1.0 for v in kinds.values())
    copy = metrics["eval/word_copy_token_accuracy"]
    assert set(copy) <= {"first", "second", "later"} and all(0.0 <= v <= 1.0 for v in copy.values())
    assert ensure_tiny_model(MICRO) == path  # cached: no rebuild
    assert tiny_model_dir(dataclasses.replace(MICRO, steps=3)) != path  # a new recipe is a new directory
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path / "b"))
    again = ensure_tiny_model(MICRO)
    policy_a = HFPolicy(PolicyConfig(model=str(path)))
    policy_b = HFPolicy(PolicyConfig(model=str(again)))
    for (name, a), (_, b) in zip(
        policy_a.model.state_dict().items(), policy_b.model.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert policy_a.tokenizer.chat_template and len(policy_a.tokenizer) == 400


@pytest.mark.slow
def test_real_tiny_model_answers_from_its_facts():
    """The real recipe (minutes): held-out EM with the gold facts clearly above EM without them."""
    metrics = json.loads((ensure_tiny_model() / "metrics.json").read_text())
    assert metrics["eval/em_with_gold_facts"] > metrics["eval/em_without_gold_facts"] + 0.2


def test_single_fact_recall_examples_ask_about_their_one_fact_with_random_words():
    from memrl_adapters.synthetic import ask, parse_statement

    from memrl.policy.tiny import make_recall_examples
    from memrl.policy.tiny_data import random_word

    tok = byte_tokenizer()
    recipe = dataclasses.replace(MICRO, train_episodes=30, answer_words="random")
    examples = make_recall_examples(recipe, tok)
    assert len(examples) == 30
    words = 0
    for ex in examples:
        prompt = tok.decode(ex.prompt_ids)
        [line] = [x for x in prompt.splitlines() if x.startswith("- ")]
        person, attr, value, _ = parse_statement(line.split(": ", 1)[1])
        response = tok.decode(list(ex.response_ids))
        assert response.startswith(f"<|user|>\n{ask(attr, person)}\n<|assistant|>\n<answer>{value}</answer>")
        assert ex.response_ids[-1] == tok.eos_token_id and len(ex.prompt_ids) < 120
        words += not value.isdigit()
    assert words > 5
    rng = random.Random(0)
    drawn = [random_word(rng, False) for _ in range(200)]
    assert all(w.isalpha() and w.islower() and 3 <= len(w) <= 8 for w in drawn) and len(set(drawn)) > 190


def test_recall_stage_runs_before_the_pipeline_stage_and_enters_the_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMRL_TINY_THREADS", "1")
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path))
    staged = dataclasses.replace(MICRO, recall_steps=3, answer_words="random")
    assert staged.digest() != MICRO.digest()
    assert TinyRecipe().digest() == "6de45e228564"  # the build shipped in memrl/policy/shipped
    metrics = json.loads((ensure_tiny_model(staged) / "metrics.json").read_text())
    assert len(metrics["losses"]) == staged.recall_steps + staged.steps


def _build_seeing_batches(monkeypatch, recipe, view) -> list[list]:
    """Build ``recipe`` and return ``view(example)`` for every example of every SFT batch, in order."""
    import memrl.policy.tiny as tiny

    seen = []
    real_batch = tiny._batch

    def spy(examples, pad_id, prompt_weight):
        seen.append([view(e) for e in examples])
        return real_batch(examples, pad_id, prompt_weight)

    monkeypatch.setattr(tiny, "_batch", spy)
    ensure_tiny_model(recipe)
    return seen


def test_recall_mix_puts_single_fact_examples_into_every_pipeline_batch(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMRL_TINY_THREADS", "1")
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path))
    mixed = dataclasses.replace(MICRO, batch_size=4, steps=3, recall_mix=0.5)
    assert mixed.digest() != MICRO.digest()
    seen = _build_seeing_batches(monkeypatch, mixed, lambda e: len(e.prompt_ids))
    assert len(seen) == mixed.steps
    # 4 pipeline examples (long prompts: template + facts) then round(4 * 0.5) = 2 single-fact ones (short).
    for lengths in seen:
        assert len(lengths) == 6
        assert min(lengths[:4]) > max(lengths[4:])


def test_word_copy_accuracy_scores_each_answer_token_against_the_gold_word():
    from types import SimpleNamespace

    from memrl.policy.tiny import make_tokenizer, word_copy_accuracy

    recipe = dataclasses.replace(MICRO, train_episodes=40)
    tok = make_tokenizer(recipe)

    class Oracle(torch.nn.Module):
        """Predicts the token that actually follows (shift=1) or the one after it (shift=2: wrong unless a token
        repeats)."""

        def __init__(self, shift):
            super().__init__()
            self.shift = shift

        def forward(self, input_ids):
            nxt = torch.roll(input_ids, -self.shift, dims=1)
            return SimpleNamespace(logits=torch.nn.functional.one_hot(nxt, len(tok)).float())

    right = word_copy_accuracy(Oracle(1), tok, recipe, episodes=30)
    assert right and set(right.values()) == {1.0} and "first" in right and "second" in right
    wrong = word_copy_accuracy(Oracle(2), tok, recipe, episodes=30)
    assert wrong["second"] < 0.5


def test_bpe_tokenizer_round_trips_any_text_and_shortens_task_text():
    from memrl.policy.tiny import make_tokenizer

    recipe = dataclasses.replace(MICRO, train_episodes=40)
    tok = make_tokenizer(recipe)
    again = make_tokenizer(recipe)
    assert tok.backend_tokenizer.to_str() == again.backend_tokenizer.to_str()  # deterministic
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2) and len(tok) == 400
    for text in ["Mia's pet is called Rex.", "Ünïcödé — 東京 🙂\n\ttabs", "<answer>42</answer>", "xqzvbt"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.decode(ids) == text
    task = make_sft_examples(MICRO, byte_tokenizer())[0]
    text = byte_tokenizer().decode(list(task.prompt_ids))
    # spaces are tokens of their own (bpe_isolate_spaces), so a 400-id BPE saves ~40 % rather than ~50 %
    assert len(tok(text, add_special_tokens=False)["input_ids"]) < 0.7 * len(task.prompt_ids)


def test_isolated_spaces_give_a_word_the_same_tokens_in_a_fact_and_in_the_answer():
    from memrl.policy.tiny import make_tokenizer

    def pieces(tok, text, word):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        return [tok.decode([i]) for i in ids], tok(word, add_special_tokens=False)["input_ids"], ids

    glued = make_tokenizer(dataclasses.replace(MICRO, train_episodes=40, bpe_isolate_spaces=False))
    isolated = make_tokenizer(dataclasses.replace(MICRO, train_episodes=40))
    assert MICRO.bpe_isolate_spaces and TinyRecipe().bpe_isolate_spaces
    for word in ["Rocky", "farmer", "791", "Qzvbt"]:
        fact = f"Kenji's value is called {word}."
        _, alone, in_fact = pieces(isolated, fact, word)
        assert any(
            in_fact[i : i + len(alone)] == alone for i in range(len(in_fact))
        )  # a sub-sequence: pure copy
        assert isolated.decode(in_fact) == fact
    # GPT-2-style pre-tokenisation glues the space on: " savings" is one token, "savings" alone is not it
    texts, alone, in_fact = pieces(glued, "Kenji has 791 dollars in savings.", "savings")
    assert not any(in_fact[i : i + len(alone)] == alone for i in range(len(in_fact))), texts


def test_micro_builds_save_their_tokenizer_and_vocab(tmp_path, monkeypatch):
    from memrl.policy.config import PolicyConfig
    from memrl.policy.hf import HFPolicy

    monkeypatch.setenv("MEMRL_TINY_THREADS", "1")
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path))
    recipe = dataclasses.replace(MICRO, tokenizer="byte")
    assert recipe.digest() != MICRO.digest()
    assert len(HFPolicy(PolicyConfig(model=str(ensure_tiny_model(recipe)))).tokenizer) == 384
    recipe = dataclasses.replace(MICRO, train_episodes=40)
    policy = HFPolicy(PolicyConfig(model=str(ensure_tiny_model(recipe))))
    assert len(policy.tokenizer) == 400 == policy.model.config.vocab_size
    assert policy.tokenizer.chat_template
    prompt = policy.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    assert policy.tokenizer.decode(prompt).endswith("<|assistant|>\n")
    with pytest.raises(ValueError, match="valid: 'byte', 'bpe'"):
        from memrl.policy.tiny import make_tokenizer

        make_tokenizer(dataclasses.replace(MICRO, tokenizer="words"))


def test_a_shipped_build_is_used_unless_the_cache_has_one_or_force(tmp_path, monkeypatch):
    import memrl.policy.tiny as tiny

    monkeypatch.setenv("MEMRL_TINY_THREADS", "1")
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(tiny, "SHIPPED_DIR", tmp_path / "shipped")
    shipped = tmp_path / "shipped" / f"tiny-{MICRO.digest()}"
    shipped.mkdir(parents=True)
    (shipped / "metrics.json").write_text("{}")
    assert ensure_tiny_model(MICRO) == shipped  # no build happened
    assert not tiny_model_dir(MICRO).exists()
    built = ensure_tiny_model(MICRO, force=True)
    assert built == tiny_model_dir(MICRO) and (built / "model.safetensors").is_file()
    assert ensure_tiny_model(MICRO) == built  # the cache's own build wins over the shipped copy


def test_copy_drills_ask_for_values_that_only_the_context_holds():
    from memrl.policy.tiny_data import copy_drill_example, encode_text, letter_token_ids

    tok = byte_tokenizer()
    letters = letter_token_ids(tok)
    assert len(letters) == 52 and all(tok.decode([i]).isalpha() for i in letters)
    colon, newline = encode_text(tok, ": "), encode_text(tok, "\n")
    rng = random.Random(0)
    for _ in range(50):
        ex = copy_drill_example(letters, tok, rng)
        lines = tok.decode(list(ex.prompt_ids)).splitlines()
        table = dict(line.split(": ") for line in lines)
        assert 4 <= len(table) == len(lines) <= 10  # distinct keys
        ids, mask = list(ex.response_ids), list(ex.response_mask)
        asked = tok.decode(ids).splitlines()
        assert len(asked) == 3
        for line in asked:
            key, value = line.split(": ")
            assert table[key] == value
        # Trained: exactly the value tokens and their newline, never the key or the colon.
        trained = [t for t, m in zip(ids, mask, strict=True) if m]
        expected = [t for line in asked for t in encode_text(tok, line.split(": ")[1]) + newline]
        assert trained == expected and colon[0] not in trained


def test_copy_mix_puts_drills_into_every_batch_and_enters_the_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMRL_TINY_THREADS", "1")
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path))
    mixed = dataclasses.replace(MICRO, batch_size=4, steps=2, copy_mix=0.5, copy_examples=30)
    assert mixed.digest() != MICRO.digest()
    assert TinyRecipe().digest() == "6de45e228564"  # the shipped build is unaffected
    seen = _build_seeing_batches(monkeypatch, mixed, lambda e: tuple(e.response_mask))
    assert len(seen) == mixed.steps
    for masks in seen:
        # 4 pipeline examples (their response ends in eos, trained) then 2 drills (response starts with a key).
        assert len(masks) == 6 and all(m[0] == 1 for m in masks[:4]) and all(m[0] == 0 for m in masks[4:])


def test_repeat_drills_repeat_a_line_of_letter_words_and_train_only_the_repeat():
    from memrl.policy.tiny_data import encode_text, letter_token_ids, repeat_drill_example

    tok = byte_tokenizer()
    letters = letter_token_ids(tok)
    rng = random.Random(0)
    lines = []
    for _ in range(50):
        ex = repeat_drill_example(letters, tok, rng)
        assert ex.prompt_ids == ex.response_ids and set(ex.response_mask) == {1}
        text = tok.decode(list(ex.prompt_ids))
        assert text.endswith(" \n") and 3 <= len(text.split()) <= 8
        assert all(w.isalpha() for w in text.split())
        lines.append(text)
    assert len(set(lines)) == 50 and encode_text(tok, "\n")[0] == ex.prompt_ids[-1]


def test_repeat_stage_runs_first_on_short_drills_and_enters_the_digest(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMRL_TINY_THREADS", "1")
    monkeypatch.setenv("MEMRL_CACHE_DIR", str(tmp_path))
    staged = dataclasses.replace(MICRO, repeat_steps=3, repeat_batch_size=5, copy_examples=20)
    assert staged.digest() != MICRO.digest()
    assert TinyRecipe().digest() == "6de45e228564"  # the shipped build is unaffected
    seen = _build_seeing_batches(monkeypatch, staged, lambda e: e.prompt_ids == e.response_ids)
    assert [len(b) for b in seen] == [5] * 3 + [MICRO.batch_size] * MICRO.steps
    assert all(all(b) for b in seen[:3]) and not any(any(b) for b in seen[3:])
    metrics = json.loads((tiny_model_dir(staged) / "metrics.json").read_text())
    assert len(metrics["losses"]) == staged.repeat_steps + staged.steps
