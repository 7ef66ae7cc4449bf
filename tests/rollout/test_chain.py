from __future__ import annotations

from memrl.rollout import STRATEGIES, RolloutConfig, RolloutRequest, run_rollout
from memrl.testing.scripted import ScriptedPolicy, random_script
from tests.rollout.rollout_fixtures import PROMPT, encode


def test_chains_share_the_prompt_once_and_return_n_distinct_leaves(tok):
    reqs = [RolloutRequest(encode(tok, f"#{i} {PROMPT}"), f"ep{i}", turn_id="D1:5") for i in range(3)]
    pol = ScriptedPolicy(tok, random_script(min_tokens=10, max_tokens=30))
    result = run_rollout(reqs, pol, None, RolloutConfig(strategy="chain", n=5, seed=7))
    assert [len(x) for x in result.leaves] == [5, 5, 5]
    for req, leaves in zip(reqs, result.leaves, strict=True):
        assert all(s.prompt_ids == req.prompt_ids and s.turn_id == "D1:5" for s in leaves)
        assert len({s.response_ids for s in leaves}) == 5
        assert [s.meta.node_path for s in leaves] == [(i,) for i in range(5)]
        assert all(s.meta.tree_id is None and s.meta.branch_depth == 0 for s in leaves)
    # One request per prompt with n=5: each prompt is prefilled once, not five times.
    assert pol.stats.generate_calls == 1 and pol.stats.requests == 3
    assert pol.stats.prefill_tokens + pol.stats.cached_tokens == sum(len(r.prompt_ids) for r in reqs)
    assert pol.stats.cached_tokens == 2  # only the "#" the second and third prompt share with the first
    assert result.metrics["rollout/forwarded_tokens"] == pol.stats.prefill_tokens + pol.stats.decode_tokens


def test_same_seed_same_leaves(tok):
    reqs = [RolloutRequest(encode(tok, PROMPT), "ep")]
    runs = [
        run_rollout(reqs, ScriptedPolicy(tok, random_script()), None, RolloutConfig(strategy=s, n=4, seed=3))
        for s in ("chain", "chain", "tree", "tree")
    ]
    assert runs[0].leaves == runs[1].leaves and runs[2].leaves == runs[3].leaves


def test_strategy_registry_lists_choices():
    assert STRATEGIES.names() == ["chain", "tree"]
    try:
        STRATEGIES.get("beam")
    except KeyError as exc:
        assert "chain, tree" in str(exc)
    else:
        raise AssertionError("unknown strategy accepted")
