"""Imitation warm start of the answer role: real target prompts (MiniLM + FAISS), gold programs run in the sandbox."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import ByT5Tokenizer

from memrl.config import load_config
from memrl.data.adapters import load_dataset
from memrl.episode.build import build_runner
from memrl.testing.scripted import ScriptedPolicy
from memrl.train.config import WarmStartConfig
from memrl.train.demonstrations import GoldDemonstrations, ProgramRunner
from memrl.train.warm_start_answer import answer_demonstrations, target_prompts


def _never(ctx):
    raise AssertionError("building warm-start prompts must not generate")


@pytest.fixture(scope="module")
def episodes():
    cfg = load_config(
        None,
        [
            "data.options={num_episodes: 8, arithmetic_range: [1000, 9999], "
            "question_types: [arithmetic, lookup]}",
            "tools.enabled=[python]",
            "episode.tool_example=true",
        ],
    )
    inputs, _ = load_dataset(cfg.data)
    tok = ByT5Tokenizer()
    runner = build_runner(cfg, policy=ScriptedPolicy(tok, _never))
    prompts, kept = target_prompts(runner, inputs)
    programs = ProgramRunner(cfg.tools)
    yield cfg, tok, prompts, kept, programs
    programs.close()


def test_a_question_with_a_program_is_demonstrated_as_its_call_result_and_answer(episodes):
    cfg, tok, prompts, kept, programs = episodes
    assert len(kept) == 8
    demos = answer_demonstrations(prompts, kept, GoldDemonstrations(tok, 1.0, run_program=programs))
    assert [d.decision for d in demos] == ["program", "answer"] * 4
    for d, bi, prompt in zip(demos, kept, prompts, strict=True):
        assert (
            d.prompt_ids == prompt
            and d.episode_id == bi.episode_id
            and d.response_ids[-1] == tok.eos_token_id
        )
        text = tok.decode(list(d.response_ids[:-1]))
        if d.decision == "answer":
            assert text == f"<answer>{bi.target_answer}</answer>" and d.response_mask is None
            continue
        program = bi.metadata["gold_python"]
        assert (
            text
            == f"<python>{program}</python> <result>{bi.target_answer}</result><answer>{bi.target_answer}</answer>"
        )
        mask = d.response_mask
        written = tok.decode([t for t, m in zip(d.response_ids[:-1], mask, strict=False) if m])
        injected = tok.decode([t for t, m in zip(d.response_ids, mask, strict=True) if not m])
        assert injected == f" <result>{bi.target_answer}</result>"  # read, never trained
        assert written == f"<python>{program}</python><answer>{bi.target_answer}</answer>"


def test_without_a_program_runner_every_question_is_demonstrated_as_its_answer(episodes):
    _, tok, prompts, kept, _ = episodes
    demos = answer_demonstrations(prompts, kept, GoldDemonstrations(tok, 1.0))
    assert {d.decision for d in demos} == {"answer"} and all(d.response_mask is None for d in demos)


def test_a_program_that_does_not_print_its_gold_answer_is_a_dataset_error(episodes):
    _, tok, prompts, kept, programs = episodes
    bad = dataclasses.replace(kept[0], metadata={**kept[0].metadata, "gold_python": "print(1 + 1)"})
    with pytest.raises(ValueError, match="must print exactly its answer"):
        answer_demonstrations(prompts[:1], [bad], GoldDemonstrations(tok, 1.0, run_program=programs))


def test_episodes_whose_prompt_fails_are_left_out_by_name_and_all_failing_raises(episodes, caplog):
    cfg, tok, _, kept, _ = episodes
    tight = dataclasses.replace(cfg, episode=dataclasses.replace(cfg.episode, prompt_token_budget=20))
    runner = build_runner(tight, policy=ScriptedPolicy(tok, _never))
    with pytest.raises(ValueError, match="every episode's prompt failed"):
        target_prompts(runner, kept[:2])
    assert kept[0].episode_id in caplog.text and "left out" in caplog.text


def test_the_answer_role_has_no_writer_check():
    assert WarmStartConfig(episodes=4, role="answer").role == "answer"
    with pytest.raises(ValueError, match="role must be one of 'memory', 'answer'"):
        WarmStartConfig(role="writer")
    with pytest.raises(ValueError, match="check_episodes and balance_ops score and weigh memory writes"):
        WarmStartConfig(episodes=4, role="answer", check_episodes=2)
