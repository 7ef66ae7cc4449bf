"""What the target-turn prompt carries besides the question: the ``episode.context`` modes, one registry.

* ``memory`` — the history is ingested into memory; the prompt holds the retrieved facts and the summary, and the
  answer is written back (the product).
* ``none`` — the question alone (the no-memory ablation).
* ``recent_history`` — the latest raw history turns that fit the policy's window (:mod:`memrl.episode.recent`;
  the "full context" baseline cut to the window).

Modes other than ``memory`` build no memory at all, so no tool (``memory_search``) can read the history either.
"""

from __future__ import annotations

from dataclasses import dataclass

from memrl.registry import Registry


@dataclass(frozen=True)
class ContextMode:
    """``memory``: history → memory, retrieval and summary in the prompt, the answer written back.
    ``recent_turns``: the prompt holds the latest raw history turns (:class:`~memrl.episode.recent.RecentHistory`)."""

    memory: bool = False
    recent_turns: bool = False

    def __post_init__(self) -> None:
        if self.memory and self.recent_turns:
            raise ValueError(
                "ContextMode: a prompt holds either retrieved memory or the recent turns, not both"
            )


CONTEXT_MODES: Registry[ContextMode] = Registry("episode context")
CONTEXT_MODES.register("memory")(ContextMode(memory=True))
CONTEXT_MODES.register("none")(ContextMode())
CONTEXT_MODES.register("recent_history")(ContextMode(recent_turns=True))


def context_mode(name: str) -> ContextMode:
    """The mode ``name`` (an unknown name raises an error listing the valid ones)."""
    mode = CONTEXT_MODES.get(name)
    if not isinstance(mode, ContextMode):
        raise TypeError(f"episode.context={name!r} is a {type(mode).__name__}, expected a ContextMode")
    return mode
