"""episode.context=recent_history: the latest raw history turns that fit the window, the same slice for every
question of one history, no memory built (scripted policy, real MiniLM + FAISS memory system)."""

from __future__ import annotations

import pytest
from transformers import ByT5Tokenizer

from memrl.config import load_config
from memrl.episode.build import build_runner
from memrl.episode.config import EpisodeConfig
from memrl.episode.prompt import PromptFact
from memrl.episode.recent import QUESTION_RESERVE_TOKENS, RecentHistory
from memrl.testing.scripted import ScriptedPolicy
from memrl.types import BatchInput, TurnSpec

WINDOW, RESPONSE = 1200, 64  # bytes = tokens for the byte-level tokenizer
TURNS = 80


def _turn(i: int) -> TurnSpec:
    return TurnSpec(
        "history",
        f"I now keep {i} plants at home.",
        f"D1:{i}",
        "Ann",
        f"2023-{i // 28 + 1:02d}-{i % 28 + 1:02d}",
    )


def _episode(eid: str, question: str) -> BatchInput:
    history = tuple(_turn(i) for i in range(TURNS))
    return BatchInput(eid, eid, (*history, TurnSpec("target", question, "Q")), question, "80")


@pytest.fixture(scope="module")
def runner():
    cfg = load_config(
        None,
        [
            "tools.enabled=[]",
            "rollout.n=1",
            f"rollout.max_response_tokens={RESPONSE}",
            "episode.context=recent_history",
            "episode.record_history_turns=true",
        ],
    )
    policy = ScriptedPolicy(ByT5Tokenizer(), lambda ctx: "<answer>80</answer>")
    policy.max_model_len = WINDOW  # as HFPolicy reports its context window
    run = build_runner(cfg, policy=policy)

    def no_memory(*args, **kwargs):
        raise AssertionError("recent_history must not build or read memory")

    run.memory.extract_facts_batch = run.memory.retrieve_batch = run.memory.compress_batch = no_memory
    return run


def _system(runner, traj) -> str:
    text = runner.policy.tokenizer.decode(list(traj.steps[-1].prompt_ids))
    return text.split("<|user|>")[0]


def test_prompt_holds_the_latest_turns_the_same_for_every_question(runner):
    a, b, long = runner.run_batch(
        [
            _episode("a", "How many plants?"),
            _episode("b", "And Ann's plants now?"),
            _episode("c", "Why? " * 80),
        ]
    )
    target = a.steps[-1]
    system = _system(runner, a)
    # The newest turn, rendered like a fact.
    assert "[2023-03-24] Ann: I now keep 79 plants at home." in system
    assert "keep 0 plants" not in system  # the oldest did not fit
    extra = target.meta.extra
    kept = list(target.meta.included_fact_ids)
    assert kept == list(range(TURNS - len(kept), TURNS)) and 5 < len(kept) < TURNS  # a suffix, oldest first
    lines = [line for line in system.splitlines() if line.startswith("- [")]
    assert [int(line.split("keep ")[1].split()[0]) for line in lines] == kept
    assert extra["context_turns"] == len(kept) and extra["context_turns_total"] == TURNS
    assert 0 < extra["context_tokens"] < extra["context_tokens_total"]
    assert a.metrics["episode/context_turns"] == len(kept)
    # Chosen without the question: byte-identical system messages, so the prompts share that prefix.
    assert _system(runner, b) == system
    for traj in (a, b, long):
        assert len(traj.steps[-1].prompt_ids) <= WINDOW - RESPONSE
        assert not traj.steps[-1].meta.memory_ops and not traj.steps[-1].meta.retrieved_ids
        assert all(not s.meta.memory_ops for s in traj.steps[:-1])  # history steps carry no memory ops
    # A question longer than the reserve makes the prompt builder cut the oldest turns, never the newest.
    long_kept = list(long.steps[-1].meta.included_fact_ids)
    assert long_kept == kept[len(kept) - len(long_kept) :] and len(long_kept) < len(kept)


def test_slice_fits_the_window_without_the_question():
    tok = ByT5Tokenizer()
    recent = RecentHistory(EpisodeConfig(), tok, window=WINDOW, max_response_tokens=RESPONSE)
    history = [_turn(i) for i in range(TURNS)]
    part = recent.select(history)
    assert recent.select(list(history)) is part  # one slice per history, reused by its other questions
    limit = WINDOW - RESPONSE - QUESTION_RESERVE_TOKENS
    start = part.facts[0].id
    turn = history[start - 1]
    older = PromptFact(id=start - 1, text=turn.text, timestamp=turn.timestamp, speaker=turn.speaker)
    assert recent._tokens(part.facts) <= limit < recent._tokens((older, *part.facts))  # as many as fit
    short = recent.select(history[:3])
    assert [f.id for f in short.facts] == [0, 1, 2]  # a short history fits whole
    with pytest.raises(ValueError, match="max_model_len"):
        RecentHistory(EpisodeConfig(), tok, window=300, max_response_tokens=RESPONSE)


def test_context_is_validated():
    with pytest.raises(ValueError, match="memory, none, recent_history"):
        EpisodeConfig(context="full")
