"""``episode.context`` modes: one registry of typed modes the runner reads."""

from __future__ import annotations

import pytest

from memrl.episode.config import EpisodeConfig
from memrl.episode.context_modes import CONTEXT_MODES, ContextMode, context_mode
from memrl.episode.runner import EpisodeRunner
from memrl.episode.snapshot import SnapshotHost


def test_modes_say_whether_the_prompt_holds_memory_or_recent_turns():
    assert CONTEXT_MODES.names() == ["memory", "none", "recent_history"]
    assert context_mode("memory") == ContextMode(memory=True)
    assert context_mode("none") == ContextMode()
    assert context_mode("recent_history") == ContextMode(recent_turns=True)
    with pytest.raises(ValueError, match="either retrieved memory or the recent turns"):
        ContextMode(memory=True, recent_turns=True)


def test_an_unknown_context_lists_the_valid_ones():
    with pytest.raises(
        ValueError, match="episode.context: unknown episode context 'full'; valid choices: memory, "
    ):
        EpisodeConfig(context="full")


def test_the_runner_offers_the_snapshot_scorer_its_narrow_interface():
    """The scorer reaches the runner only through :class:`SnapshotHost`: these seven members, all public."""
    methods = {n for n, v in vars(SnapshotHost).items() if callable(v) or isinstance(v, property)} - {
        "__init__"
    }
    methods = {n for n in methods if not n.startswith("_")}
    assert set(SnapshotHost.__annotations__) == {"memory", "policy", "reward"}
    assert methods == {"max_response_tokens", "memory_room", "prompt_tokens", "answer_prompt"}
    for name in methods:
        assert isinstance(getattr(EpisodeRunner, name), type(getattr(SnapshotHost, name))), name
