from __future__ import annotations

import pytest

from memrl.config import load_config
from memrl.rollout import RollbackConfig, RolloutConfig, TreeConfig


def test_defaults_follow_the_seed():
    rb = RollbackConfig()
    assert rb.enable_tool_rollback is False and rb.max_tool_retries == 3
    assert rb.rollback_on_errors == [
        "ImportError",
        "ModuleNotFoundError",
        "SyntaxError",
        "IndentationError",
        "NameError",
        "tool call format is wrong",
    ]


def test_overrides_reach_the_nested_configs():
    cfg = load_config(
        None, ["rollout.strategy=tree", "rollout.tree.beam_size=4", "rollout.rollback.max_tool_retries=1"]
    )
    assert cfg.rollout.strategy == "tree" and cfg.rollout.tree.beam_size == 4
    assert cfg.rollout.rollback.max_tool_retries == 1


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TreeConfig(beam_size=1), "beam_size must be >= 2"),
        (lambda: TreeConfig(segment_tokens=0), "segment_tokens"),
        (lambda: RollbackConfig(enable_tool_rollback=True, rollback_on_errors=[]), "nothing would"),
        (lambda: RollbackConfig(feedback_template="fix it"), "{error}"),
        (lambda: RolloutConfig(n=0), "rollout.n"),
        (lambda: RolloutConfig(top_p=0), "top_p"),
    ],
)
def test_invalid_values_say_how_to_fix_them(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_leaves_per_tree():
    assert (
        TreeConfig(
            initial_rollouts=1, expansion_iterations=3, nodes_per_expansion=5, beam_size=2
        ).leaves_per_tree()
        == 16
    )
